"""The only module that talks to the API server (besides kopf's own watching).

Every write passes one gate, `Kube.may_write` (operator/leader.py: only while this process
holds the leader Lease); a write without it raises `NotLeader`, before any byte is sent. The
Lease itself is the exception: it is how a process becomes the one that may write.

Every write is safe to repeat: create ignores 409 (it exists), delete ignores 404 (it is
gone) and carries a uid precondition (a same-named successor is never hit), and the status
is replaced with the resourceVersion it was computed from, so a decision made on a stale
view fails with `Conflict` instead of overwriting newer truth.

Requests go through aiohttp on kopf's event loop (see `Kube`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import socket
import ssl
import time
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import aiohttp
from kubernetes import client, config

from kubetrain.api import naming
from kubetrain.api.contract import format_members
from kubetrain.operator import kueue
from kubetrain.operator.metrics import API_WRITES

COMPONENT = "kubetrain-operator"
log = logging.getLogger("kubetrain.operator")


# What a create answers with: the object's metadata only (the API server's
# PartialObjectMetadata, as for `kubectl get -o name`). The controller reads the new pod's uid,
# labels and creationTimestamp; the whole pod is ~5 KB of JSON decoded per created pod.
METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
# A watch (at most 300 s, informer.WATCH_SECONDS) or log stream silent this long is dead.
WATCH_READ_SECONDS = 360.0


class ApiError(Exception):
    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        try:
            message = str(json.loads(body).get("message", ""))
        except (TypeError, ValueError, AttributeError):
            message = body[:500].decode(errors="replace")
        super().__init__(f"{status}: {message}")
        self.message = message


# What the kubelet answers for a container it has removed (a deleted pod's, once stopped): a 200
# whose body is this one line. It sends the headers before it asks the runtime for the container,
# so the error can only come as the body (kubelet_pods.go, GetKubeletContainerLogs).
_LOG_GONE = re.compile(rb"unable to retrieve container logs for \S+")


def log_gone(body: bytes) -> bool:
    """Whether a pods/log answer is the kubelet's notice that the container's log is gone."""
    return _LOG_GONE.fullmatch(body.strip()) is not None


class NotLeader(Exception):
    """A write refused before it was sent: this process does not hold the leader Lease (or
    could not renew it in time), so another may be writing."""


class Conflict(Exception):
    """The object changed since it was read (409 on a resourceVersion precondition)."""


class Refused(Exception):
    """A create the API server refused (403 forbidden, 422 invalid); `refusal.classify` says
    whether it can pass later."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def load_configuration() -> Any:
    """The in-cluster ServiceAccount's credentials, else the current kubeconfig's."""
    configuration = client.Configuration()
    if os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    return configuration


SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def own_namespace() -> str:
    """The operator's own namespace: its pod's (the ServiceAccount's), else the kubeconfig
    context's, else "default" (what kubectl assumes)."""
    if os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
        try:
            with open(SERVICE_ACCOUNT_NAMESPACE) as file:
                return file.read().strip()
        except OSError:
            pass
    try:
        _, active = config.list_kube_config_contexts()  # type: ignore[no-untyped-call]
    except (config.ConfigException, OSError):
        return "default"
    return str((active or {}).get("context", {}).get("namespace") or "default")


def _core(namespace: str, plural: str, name: str = "") -> str:
    return f"/api/v1/namespaces/{namespace}/{plural}" + (f"/{name}" if name else "")


def _namespaced(api_version: str, namespace: str, plural: str) -> str:
    """The collection path of a namespaced kind: core/v1 lives under /api, groups under /apis."""
    if api_version == "v1":
        return _core(namespace, plural)
    return f"/apis/{api_version}/namespaces/{namespace}/{plural}"


def _job_path(namespace: str, name: str, subresource: str = "") -> str:
    path = f"/apis/{naming.GROUP}/{naming.VERSION}/namespaces/{namespace}/{naming.PLURAL}/{name}"
    return path + (f"/{subresource}" if subresource else "")


def _lease_path(namespace: str, name: str) -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases" + (f"/{name}" if name else "")


def _kueue_path(plural: str, name: str, namespace: str | None) -> str:
    scope = f"/namespaces/{namespace}" if namespace else ""
    return f"/apis/{kueue.API_VERSION}{scope}/{plural}" + (f"/{name}" if name else "")


class Kube:
    """Requests on kopf's event loop through aiohttp (which kopf already uses for watching).

    The kubernetes client only loads the credentials. Its generated methods validate every
    argument with pydantic, deserialize responses into models and block a thread per call;
    with 50 new jobs at once that overhead, not the API server, set the time to pods. The
    operator's bodies are plain dicts it rendered itself, so plain JSON over one connection
    pool is all it needs.
    """

    def __init__(self, configuration: Any, connections: int = 32) -> None:
        self.configuration = configuration
        # The write gate (see the module's docstring): always open until leader election
        # (operator/leader.py) sets it.
        self.may_write: Callable[[], bool] = lambda: True
        self.connections = connections
        self.instance = socket.gethostname()
        self._session: aiohttp.ClientSession | None = None
        # Watches hold their connections for minutes: never from the pool writes wait on.
        self._watch_session: aiohttp.ClientSession | None = None
        # Status writes, events and log reads take at most a few connections: in a burst of
        # new jobs they would otherwise queue between the pod creations users wait for.
        self._side = asyncio.Semaphore(max(2, connections // 8))

    def _ssl(self) -> ssl.SSLContext:
        c = self.configuration
        context = ssl.create_default_context(cafile=c.ssl_ca_cert)
        if not c.verify_ssl:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if c.cert_file:
            context.load_cert_chain(c.cert_file, c.key_file)
        return context

    def _session_now(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self.connections, ssl=self._ssl())
            self._session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60))
        return self._session

    async def close(self) -> None:
        for session in (self._session, self._watch_session):
            if session is not None:
                await session.close()

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        # Calls the client's refresh hook: in a pod the ServiceAccount token rotates.
        token = self.configuration.get_api_key_with_prefix("BearerToken", alias="authorization")
        if token:
            headers["Authorization"] = token
        return headers

    async def _request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, str] | None = None,
        *,
        side: bool = False,
        accept: str = "application/json",
        content_type: str = "application/json",
        gated: bool = True,
        counted: tuple[str, str] | None = None,
    ) -> bytes:
        """`counted`: the (verb, resource) a write counts under in kubetrain_api_writes_total,
        once it passed the gate (a refused one is sent nowhere, so it is not counted)."""
        if gated and method != "GET" and not self.may_write():
            raise NotLeader(f"{method} {path}: this operator does not hold the leader Lease")
        if counted is not None:
            API_WRITES.labels(*counted).inc()
        headers = {**self._headers(), "Accept": accept}
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body)
        session = self._session_now()
        url = self.configuration.host + path
        if side:
            async with self._side, session.request(method, url, params=query, data=data, headers=headers) as response:
                payload = await response.read()
        else:
            async with session.request(method, url, params=query, data=data, headers=headers) as response:
                payload = await response.read()
        if response.status >= 400:
            raise ApiError(response.status, payload)
        return payload

    # --- reads of the children (operator/informer.py) -------------------------------------
    async def list(self, path: str, query: dict[str, str]) -> dict[str, Any]:
        """One page of a list (query may carry `limit` and `continue`)."""
        page: dict[str, Any] = json.loads(await self._request("GET", path, query=query))
        return page

    def _watch_session_now(self) -> aiohttp.ClientSession:
        if self._watch_session is None or self._watch_session.closed:
            connector = aiohttp.TCPConnector(limit=0, ssl=self._ssl())
            # No total: a watch lasts up to its timeoutSeconds; a silent connection (no bookmark
            # for a minute past it) is dead.
            reads = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=WATCH_READ_SECONDS)
            self._watch_session = aiohttp.ClientSession(connector=connector, timeout=reads)
        return self._watch_session

    async def watch(self, path: str, query: dict[str, str], timeout: float) -> AsyncIterator[dict[str, Any]]:
        """The events of one watch request (`timeout`: its timeoutSeconds, below
        WATCH_READ_SECONDS), until the server ends it."""
        session = self._watch_session_now()
        query = {**query, "watch": "1", "allowWatchBookmarks": "true", "timeoutSeconds": str(int(timeout))}
        url = self.configuration.host + path
        async with session.get(url, params=query, headers=self._headers()) as response:
            if response.status >= 400:
                raise ApiError(response.status, await response.read())
            pending = b""
            # Not readline(): aiohttp caps a line at 128 KiB, and one object can be larger.
            async for chunk in response.content.iter_any():
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    if line.strip():
                        yield json.loads(line)

    # --- children -----------------------------------------------------------------------
    async def create(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        """Create a Pod, Service or PodGroup: the created object's metadata (as {"metadata": ...}),
        None if one of that name exists already. Raises `Refused` on 403/422."""
        plural = obj["kind"].lower() + "s"
        try:
            path = _namespaced(obj["apiVersion"], obj["metadata"]["namespace"], plural)
            created: dict[str, Any] = json.loads(
                await self._request("POST", path, obj, accept=METADATA_ONLY, counted=("create", plural))
            )
        except ApiError as exc:
            if exc.status == 409:
                return None
            if exc.status in (403, 422):
                raise Refused(exc.status, exc.message) from exc
            raise
        return created

    async def delete_pod(self, namespace: str, name: str, uid: str | None, grace_seconds: int | None = None) -> None:
        """`grace_seconds` None: the pod's own terminationGracePeriodSeconds."""
        body: dict[str, Any] = {"preconditions": {"uid": uid}} if uid else {}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        try:
            await self._request("DELETE", _core(namespace, "pods", name), body, counted=("delete", "pods"))
        except ApiError as exc:
            # 404: gone already. 409: the uid precondition failed, so the name belongs to a
            # newer pod, which must live.
            if exc.status not in (404, 409):
                raise

    async def move_pod(
        self, namespace: str, name: str, uid: str, attempt: int, members: Sequence[int] | None = None
    ) -> bool:
        """Relabel a living pod to `attempt` (the in-place gang restart: its torchrun agent reads the
        label through the downward API and restarts its workers). A JSON patch whose first op
        tests the uid, so a same-named pod of another attempt is never moved. False if the pod
        is gone or is another one."""
        label = "/metadata/labels/" + _pointer(naming.LABEL_ATTEMPT)
        patch = [
            {"op": "test", "path": "/metadata/uid", "value": uid},
            {"op": "replace", "path": label, "value": str(attempt)},
        ]
        if members is not None:  # an elastic gang's: the pods were created with the annotation
            annotation = "/metadata/annotations/" + _pointer(naming.MEMBERS_ANNOTATION)
            patch.append({"op": "add", "path": annotation, "value": format_members(attempt, members)})
        try:
            await self._request(
                "PATCH",
                _core(namespace, "pods", name),
                patch,
                content_type="application/json-patch+json",
                accept=METADATA_ONLY,
                counted=("patch", "pods"),
            )
        except ApiError as exc:
            # 404: gone; 409/422: the test failed (the name is another pod's now).
            if exc.status in (404, 409, 422):
                return False
            raise
        return True

    async def delete_collection(self, api_version: str, namespace: str, plural: str, selector: str) -> None:
        """Delete what `selector` matches (nothing matching, or the API gone, is fine)."""
        try:
            path = _namespaced(api_version, namespace, plural)
            await self._request("DELETE", path, query={"labelSelector": selector}, counted=("deletecollection", plural))
        except ApiError as exc:
            if exc.status != 404:
                raise

    async def merge_patch(
        self, api_version: str, namespace: str, plural: str, name: str, patch: dict[str, Any]
    ) -> None:
        """A JSON merge patch of a namespaced object (a PodGroup's minCount); one that does not
        exist (404) is fine. Raises `Refused` on 403/422 (the field is immutable there)."""
        try:
            await self._request(
                "PATCH",
                f"{_namespaced(api_version, namespace, plural)}/{name}",
                patch,
                content_type="application/merge-patch+json",
                accept=METADATA_ONLY,
                counted=("patch", plural),
            )
        except ApiError as exc:
            if exc.status in (403, 422):
                raise Refused(exc.status, exc.message) from exc
            if exc.status != 404:
                raise

    async def serves(self, api_version: str, plural: str) -> bool:
        """Discovery: whether the API server serves `plural` in `api_version` (group/version)."""
        try:
            found = json.loads(await self._request("GET", f"/apis/{api_version}", side=True))
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return any(r.get("name") == plural for r in found.get("resources") or [])

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
        try:
            written: dict[str, Any] = json.loads(
                await self._request(
                    "PUT",
                    _job_path(meta["namespace"], meta["name"], "status"),
                    document,
                    side=True,
                    counted=("update", "trainingjobs/status"),
                )
            )
        except ApiError as exc:
            if exc.status == 404:
                return None
            if exc.status == 409:
                raise Conflict(f"{meta['namespace']}/{meta['name']} changed since it was read") from exc
            raise
        return written

    async def delete_job(self, namespace: str, name: str, uid: str) -> None:
        body = {"preconditions": {"uid": uid}, "propagationPolicy": "Background"}
        try:
            await self._request("DELETE", _job_path(namespace, name), body, counted=("delete", "trainingjobs"))
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
        try:
            await self._request(
                "POST", _core(meta["namespace"], "events"), event, side=True, counted=("create", "events")
            )
        except (ApiError, aiohttp.ClientError, TimeoutError) as exc:
            # Events are for humans; the status already holds the transition.
            log.warning("event %s on %s/%s not posted: %s", reason, meta["namespace"], meta["name"], exc)

    # --- Kueue (operator/kueue.py) --------------------------------------------------------
    async def get_kueue(self, plural: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """A Workload (namespaced), ResourceFlavor or WorkloadPriorityClass; None if absent."""
        try:
            found: dict[str, Any] = json.loads(await self._request("GET", _kueue_path(plural, name, namespace)))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return found

    async def create_workload(self, workload: dict[str, Any]) -> None:
        """Create the job's Workload; an existing one (409) is fine. Raises `Refused` on 403/422."""
        try:
            await self._request(
                "POST",
                _kueue_path("workloads", "", workload["metadata"]["namespace"]),
                workload,
                counted=("create", "workloads"),
            )
        except ApiError as exc:
            if exc.status in (403, 422):
                raise Refused(exc.status, exc.message) from exc
            if exc.status != 409:
                raise

    async def replace_workload_status(self, workload: dict[str, Any], status: dict[str, Any]) -> None:
        """Write a Workload's whole status, conditional on the resourceVersion it was read at."""
        await self._replace_workload(workload, {**workload, "status": status}, "/status")

    async def replace_workload_spec(self, workload: dict[str, Any], spec: dict[str, Any]) -> None:
        """Write a Workload's spec (spec.active), conditional on the resourceVersion it was read at."""
        await self._replace_workload(workload, {**workload, "spec": spec}, "")

    async def _replace_workload(self, workload: dict[str, Any], document: dict[str, Any], subresource: str) -> None:
        meta = workload["metadata"]
        path = _kueue_path("workloads", meta["name"], meta["namespace"]) + subresource
        try:
            await self._request("PUT", path, document, side=True, counted=("update", "workloads" + subresource))
        except ApiError as exc:
            # 409: Kueue changed it since it was read; that change's watch event reconciles
            # the job again, from the newer Workload. 404: gone with its job.
            if exc.status not in (404, 409):
                raise

    # --- the leader Lease (operator/leader.py); never gated: it decides who may write ------------
    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            lease: dict[str, Any] = json.loads(await self._request("GET", _lease_path(namespace, name)))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return lease

    async def create_lease(self, lease: dict[str, Any]) -> dict[str, Any] | None:
        """Create the Lease; None if another candidate created it first (409)."""
        path = _lease_path(lease["metadata"]["namespace"], "")
        try:
            created: dict[str, Any] = json.loads(await self._request("POST", path, lease, gated=False))
        except ApiError as exc:
            if exc.status == 409:
                return None
            raise
        return created

    async def replace_lease(self, lease: dict[str, Any]) -> dict[str, Any] | None:
        """Write the Lease, conditional on the resourceVersion it carries; None if it changed
        since it was read (another candidate wrote first) or is gone."""
        meta = lease["metadata"]
        try:
            written: dict[str, Any] = json.loads(
                await self._request("PUT", _lease_path(meta["namespace"], meta["name"]), lease, gated=False)
            )
        except ApiError as exc:
            if exc.status in (404, 409):
                return None
            raise
        return written

    def watch_lease(self, namespace: str, name: str, timeout: float) -> AsyncIterator[dict[str, Any]]:
        """The events of the one Lease (a fieldSelector on its name: RBAC may grant it by name)."""
        return self.watch(_lease_path(namespace, ""), {"fieldSelector": f"metadata.name={name}"}, timeout)

    async def read_log(self, namespace: str, pod: str, tail_lines: int) -> str:
        """The trainer's last `tail_lines` lines. Raises ApiError when there is no log, a
        container the kubelet has removed included (it answers that one 200: `log_gone`)."""
        query = {"container": naming.CONTAINER_NAME, "tailLines": str(tail_lines)}
        data = await self._request("GET", _core(namespace, "pods", pod) + "/log", query=query, side=True)
        if log_gone(data):
            raise ApiError(410, data.strip())
        return data.decode("utf-8", errors="replace")

    async def stream_log(
        self, namespace: str, pod: str, tail_lines: int, opened: asyncio.Event | None = None
    ) -> AsyncIterator[bytes]:
        """The trainer's log from its last `tail_lines` lines on, as it is written, until the
        container exits (pods/log?follow=true): on the watch connections, which have no total
        timeout. `opened` is set once the kubelet answered: from then on the stream has the log
        even if the container is removed."""
        session = self._watch_session_now()
        query = {"container": naming.CONTAINER_NAME, "tailLines": str(tail_lines), "follow": "true"}
        url = self.configuration.host + _core(namespace, "pods", pod) + "/log"
        async with session.get(url, params=query, headers=self._headers()) as response:
            if response.status >= 400:
                raise ApiError(response.status, await response.read())
            if opened is not None:
                opened.set()
            async for chunk in response.content.iter_any():
                yield chunk

    # --- the log archive (operator/archive.py) ---------------------------------------------
    async def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = json.loads(await self._request("GET", _core(namespace, "configmaps", name)))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return found

    async def json_patch(self, namespace: str, plural: str, name: str, operations: Sequence[dict[str, Any]]) -> bool:
        """Apply a JSON patch (RFC 6902) to a core object: False if it is gone (404) or one of the
        patch's `test` operations failed (422), which leaves the object untouched. Raises
        `Refused` on 403."""
        try:
            await self._request(
                "PATCH",
                _core(namespace, plural, name),
                operations,
                accept=METADATA_ONLY,
                content_type="application/json-patch+json",
                counted=("patch", plural),
            )
        except ApiError as exc:
            if exc.status in (404, 422):
                return False
            if exc.status == 403:
                raise Refused(exc.status, exc.message) from exc
            raise
        return True


def _pointer(key: str) -> str:
    """A map key as one JSON pointer segment (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")
