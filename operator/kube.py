"""The only module that talks to the API server (besides kopf's own watching).

Every write is safe to repeat: create ignores 409 (it exists), delete ignores 404 (it is
gone) and carries a uid precondition (a same-named successor is never hit), and the status
is replaced with the resourceVersion it was computed from, so a decision made on a stale
view fails with `Conflict` instead of overwriting newer truth.

The kubernetes client is synchronous; calls run in a thread pool so that one slow call
never blocks kopf's event loop. Responses are read raw (`_preload_content=False`): the
generated models' deserialization costs more CPU than the request itself.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, TypeVar

from kubernetes import client, config

from . import naming
from .metrics import API_WRITES

T = TypeVar("T")
COMPONENT = "kubetrain-operator"


class Conflict(Exception):
    """The object changed since it was read (409 on a resourceVersion precondition)."""


class Invalid(Exception):
    """The API server refused an object as invalid (422) or forbidden by policy (403)."""


def load_api_client(workers: int) -> Any:
    """An ApiClient for the in-cluster ServiceAccount, else the current kubeconfig."""
    configuration = client.Configuration()
    if os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    configuration.connection_pool_maxsize = workers
    return client.ApiClient(configuration)


class Kube:
    def __init__(self, api_client: Any, workers: int = 16) -> None:
        self.api = api_client
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kube")
        self.instance = socket.gethostname()

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool, lambda: fn(*args, **kwargs))

    @staticmethod
    def _json(response: Any) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(response.data)
        return data

    # --- children -----------------------------------------------------------------------
    async def create(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        """Create a Pod or Service; None if one of that name exists already."""
        namespace, kind = obj["metadata"]["namespace"], obj["kind"]
        create = self.core.create_namespaced_pod if kind == "Pod" else self.core.create_namespaced_service
        API_WRITES.labels("create", kind.lower() + "s").inc()
        try:
            return self._json(await self._call(create, namespace, obj, _preload_content=False))
        except client.ApiException as exc:
            if exc.status == 409:
                return None
            if exc.status in (403, 422):
                raise Invalid(_message(exc)) from exc
            raise

    async def delete_pod(self, namespace: str, name: str, uid: str | None) -> None:
        API_WRITES.labels("delete", "pods").inc()
        body = {"preconditions": {"uid": uid}} if uid else {}
        try:
            await self._call(self.core.delete_namespaced_pod, name, namespace, body=body, _preload_content=False)
        except client.ApiException as exc:
            # 404: gone already. 409: the uid precondition failed, so the name belongs to a
            # newer pod, which must live.
            if exc.status not in (404, 409):
                raise

    # --- the TrainingJob ----------------------------------------------------------------
    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            response = await self._call(
                self.custom.get_namespaced_custom_object,
                naming.GROUP,
                naming.VERSION,
                namespace,
                naming.PLURAL,
                name,
                _preload_content=False,
            )
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return self._json(response)

    async def replace_status(self, body: dict[str, Any], status: dict[str, Any]) -> dict[str, Any] | None:
        """Write the whole status, conditional on body's resourceVersion. None if the job is gone."""
        meta = body["metadata"]
        document = {
            "apiVersion": naming.API_VERSION,
            "kind": naming.KIND,
            "metadata": {
                "name": meta["name"],
                "namespace": meta["namespace"],
                "resourceVersion": meta["resourceVersion"],
            },
            "spec": body.get("spec", {}),
            "status": status,
        }
        API_WRITES.labels("update", "trainingjobs/status").inc()
        try:
            response = await self._call(
                self.custom.replace_namespaced_custom_object_status,
                naming.GROUP,
                naming.VERSION,
                meta["namespace"],
                naming.PLURAL,
                meta["name"],
                document,
                _preload_content=False,
            )
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            if exc.status == 409:
                raise Conflict(f"{meta['namespace']}/{meta['name']} changed since it was read") from exc
            raise
        return self._json(response)

    async def delete_job(self, namespace: str, name: str, uid: str) -> None:
        API_WRITES.labels("delete", "trainingjobs").inc()
        try:
            await self._call(
                self.custom.delete_namespaced_custom_object,
                naming.GROUP,
                naming.VERSION,
                namespace,
                naming.PLURAL,
                name,
                body={"preconditions": {"uid": uid}, "propagationPolicy": "Background"},
                _preload_content=False,
            )
        except client.ApiException as exc:
            if exc.status not in (404, 409):
                raise

    async def post_event(self, job: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """A core/v1 Event on the TrainingJob (what `kubectl describe tj` lists)."""
        meta = job["metadata"]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{time.time_ns():x}", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": naming.API_VERSION,
                "kind": naming.KIND,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
                "resourceVersion": meta.get("resourceVersion"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": COMPONENT},
            "reportingComponent": f"{naming.GROUP}/operator",
            "reportingInstance": self.instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        API_WRITES.labels("create", "events").inc()
        await self._call(self.core.create_namespaced_event, meta["namespace"], event, _preload_content=False)

    async def read_log(self, namespace: str, pod: str, tail_lines: int) -> str:
        response: Any = await self._call(
            self.core.read_namespaced_pod_log,
            pod,
            namespace,
            container=naming.CONTAINER_NAME,
            tail_lines=tail_lines,
            _preload_content=False,
        )
        data: bytes = response.data
        return data.decode("utf-8", errors="replace")


def _message(exc: Any) -> str:
    try:
        return str(json.loads(exc.body).get("message", exc.reason))
    except (TypeError, ValueError):
        return str(exc.reason)
