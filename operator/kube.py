"""The only module that talks to the API server (besides kopf's own watching).

Every write is safe to repeat: create ignores 409 (it exists), delete ignores 404 (it is
gone) and carries a uid precondition (a same-named successor is never hit), and the status
is replaced with the resourceVersion it was computed from, so a decision made on a stale
view fails with `Conflict` instead of overwriting newer truth.

The kubernetes client is synchronous; calls run in a thread pool so that one slow call
never blocks kopf's event loop.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from kubernetes import client, config

from . import naming
from .metrics import API_WRITES

COMPONENT = "kubetrain-operator"


class ApiError(Exception):
    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        try:
            message = str(json.loads(body).get("message", ""))
        except (TypeError, ValueError, AttributeError):
            message = body[:500].decode(errors="replace")
        super().__init__(f"{status}: {message}")
        self.message = message


class Conflict(Exception):
    """The object changed since it was read (409 on a resourceVersion precondition)."""


class Invalid(Exception):
    """The API server refused an object for good: invalid (422) or denied by admission (403)."""


def load_api_client(workers: int) -> Any:
    """An ApiClient for the in-cluster ServiceAccount, else the current kubeconfig."""
    configuration = client.Configuration()
    if os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    configuration.connection_pool_maxsize = workers
    return client.ApiClient(configuration)


def _core(namespace: str, plural: str, name: str = "") -> str:
    return f"/api/v1/namespaces/{namespace}/{plural}" + (f"/{name}" if name else "")


def _job_path(namespace: str, name: str, subresource: str = "") -> str:
    path = f"/apis/{naming.GROUP}/{naming.VERSION}/namespaces/{namespace}/{naming.PLURAL}/{name}"
    return path + (f"/{subresource}" if subresource else "")


class Kube:
    def __init__(self, api_client: Any, workers: int = 16) -> None:
        self.api = api_client
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kube")
        self.instance = socket.gethostname()

    def _request_sync(
        self, method: str, path: str, body: Any = None, query: list[tuple[str, Any]] | None = None
    ) -> bytes:
        # The client's generated methods validate every argument with pydantic and
        # deserialize responses into models: several ms of CPU per call, which dominated
        # creating 50 gangs at once. The operator's bodies are plain dicts it rendered
        # itself, so it uses the client's transport (auth, TLS, connection pool) directly.
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        method, url, headers, body, _ = self.api.param_serialize(
            method, path, query_params=query or [], header_params=headers, body=body, auth_settings=["BearerToken"]
        )
        response = self.api.call_api(method, url, headers, body)
        data: bytes = response.read()
        if response.status >= 400:
            raise ApiError(response.status, data)
        return data

    async def _request(
        self, method: str, path: str, body: Any = None, query: list[tuple[str, Any]] | None = None
    ) -> bytes:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool, lambda: self._request_sync(method, path, body, query))

    # --- children -----------------------------------------------------------------------
    async def create(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        """Create a Pod or Service; None if one of that name exists already."""
        plural = obj["kind"].lower() + "s"
        API_WRITES.labels("create", plural).inc()
        try:
            path = _core(obj["metadata"]["namespace"], plural)
            created: dict[str, Any] = json.loads(await self._request("POST", path, obj))
        except ApiError as exc:
            if exc.status == 409:
                return None
            # 422: invalid; 403: refused by admission (Pod Security, a policy webhook). Both
            # refuse the same pod again. An exhausted quota is also a 403 but may clear, so
            # it is retried with backoff like any other error.
            if exc.status == 422 or (exc.status == 403 and "exceeded quota" not in exc.message):
                raise Invalid(exc.message) from exc
            raise
        return created

    async def delete_pod(self, namespace: str, name: str, uid: str | None) -> None:
        API_WRITES.labels("delete", "pods").inc()
        body = {"preconditions": {"uid": uid}} if uid else {}
        try:
            await self._request("DELETE", _core(namespace, "pods", name), body)
        except ApiError as exc:
            # 404: gone already. 409: the uid precondition failed, so the name belongs to a
            # newer pod, which must live.
            if exc.status not in (404, 409):
                raise

    # --- the TrainingJob ----------------------------------------------------------------
    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            job: dict[str, Any] = json.loads(await self._request("GET", _job_path(namespace, name)))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return job

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
            written: dict[str, Any] = json.loads(
                await self._request("PUT", _job_path(meta["namespace"], meta["name"], "status"), document)
            )
        except ApiError as exc:
            if exc.status == 404:
                return None
            if exc.status == 409:
                raise Conflict(f"{meta['namespace']}/{meta['name']} changed since it was read") from exc
            raise
        return written

    async def delete_job(self, namespace: str, name: str, uid: str) -> None:
        API_WRITES.labels("delete", "trainingjobs").inc()
        body = {"preconditions": {"uid": uid}, "propagationPolicy": "Background"}
        try:
            await self._request("DELETE", _job_path(namespace, name), body)
        except ApiError as exc:
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
        await self._request("POST", _core(meta["namespace"], "events"), event)

    async def read_log(self, namespace: str, pod: str, tail_lines: int) -> str:
        query = [("container", naming.CONTAINER_NAME), ("tailLines", tail_lines)]
        data = await self._request("GET", _core(namespace, "pods", pod) + "/log", query=query)
        return data.decode("utf-8", errors="replace")
