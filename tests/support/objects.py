"""Helpers of the operator's control-plane tests: small readers and writers of the server's
objects (the operator itself runs as tests/support/operator_process.OperatorProcess)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from kubetrain.api import naming
from support.waiting import wait_for


class Cluster:
    """Readers and writers of one test namespace's objects, through the admin client."""

    def __init__(self, api: Any, namespace: str) -> None:
        from kubernetes import client

        self.client = client
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.namespace = namespace

    def create_job(self, name: str, **spec: Any) -> dict[str, Any]:
        spec.setdefault("image", "kubetrain/trainer:test")
        body = {"apiVersion": naming.API_VERSION, "kind": naming.KIND, "metadata": {"name": name}, "spec": spec}
        job: dict[str, Any] = self.custom.create_namespaced_custom_object(
            naming.GROUP, naming.VERSION, self.namespace, naming.PLURAL, body
        )
        return job

    def job(self, name: str) -> dict[str, Any] | None:
        try:
            job: dict[str, Any] = self.custom.get_namespaced_custom_object(
                naming.GROUP, naming.VERSION, self.namespace, naming.PLURAL, name
            )
        except self.client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return job

    def patch_spec(self, name: str, spec: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(
            naming.GROUP, naming.VERSION, self.namespace, naming.PLURAL, name, {"spec": spec}
        )

    def delete_job(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(naming.GROUP, naming.VERSION, self.namespace, naming.PLURAL, name)

    def pods(self, job: str) -> list[Any]:
        selector = f"{naming.LABEL_JOB}={job}"
        items = self.core.list_namespaced_pod(self.namespace, label_selector=selector).items
        return sorted(items, key=lambda p: p.metadata.name)

    def live_pods(self, job: str, attempt: int | None = None) -> list[Any]:
        return [
            p
            for p in self.pods(job)
            if p.metadata.deletion_timestamp is None
            and (attempt is None or p.metadata.labels[naming.LABEL_ATTEMPT] == str(attempt))
        ]

    def services(self, job: str) -> list[Any]:
        selector = f"{naming.LABEL_JOB}={job}"
        return list(self.core.list_namespaced_service(self.namespace, label_selector=selector).items)

    def events(self, job: str) -> list[Any]:
        selector = f"involvedObject.name={job},involvedObject.kind={naming.KIND}"
        return list(self.core.list_namespaced_event(self.namespace, field_selector=selector).items)

    def wait_events(self, job: str, reason: str, timeout: float = 30) -> list[Any]:
        """The job's Events of `reason` once there is one. The operator posts a decision's Events
        after the status write that holds them, so a test that saw the status waits for them."""
        found: list[Any] = wait_for(
            lambda: [e for e in self.events(job) if e.reason == reason], timeout, f"{job}: a {reason} Event"
        )
        return found

    def wait_job(
        self, name: str, predicate: Callable[[dict[str, Any]], Any], what: str, timeout: float = 30
    ) -> dict[str, Any]:
        """The job once `predicate` holds for it."""
        last: dict[str, Any] = {}

        def check() -> dict[str, Any] | None:
            nonlocal last
            last = self.job(name) or {}
            return last if predicate(last) else None

        try:
            job: dict[str, Any] = wait_for(check, timeout, f"{name}: {what}", interval=0.1)
            return job
        except Exception as exc:
            raise AssertionError(f"{name}: {what}; last status: {last.get('status')}") from exc

    def run_all(self, kubelet: Any, job: str, attempt: int, nodes: int) -> None:
        """Wait for the `nodes` live pods of `attempt` and mark each Running on the fake kubelet."""
        for pod in self.wait_pods(job, nodes, attempt):
            kubelet.run(self.namespace, pod.metadata.name)

    def enforce_pod_security(self, level: str) -> None:
        """Label the namespace to enforce Pod Security `level` and wait until admission does
        (both baseline and restricted refuse a privileged pod): without the wait a pod could
        pass only because the label was not seen yet."""
        labels = {"pod-security.kubernetes.io/enforce": level, "pod-security.kubernetes.io/enforce-version": "latest"}
        self.core.patch_namespace(self.namespace, {"metadata": {"labels": labels}})
        privileged = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "privileged"},
            "spec": {"containers": [{"name": "c", "image": "busybox", "securityContext": {"privileged": True}}]},
        }

        def enforced() -> bool:
            try:
                self.core.create_namespaced_pod(self.namespace, privileged, dry_run="All")
            except self.client.ApiException as exc:
                if exc.status == 403:
                    return True
                raise
            return False

        wait_for(enforced, 10, f"Pod Security admission enforcing {level}")

    def wait_pods(self, job: str, count: int, attempt: int | None = None, timeout: float = 30) -> list[Any]:
        def check() -> list[Any] | None:
            pods = self.live_pods(job, attempt)
            return pods if len(pods) == count else None

        result: list[Any] = wait_for(check, timeout, f"{count} live pods of {job} (attempt {attempt})", interval=0.1)
        return result


def release_pods(core: Any, namespace: str) -> None:
    """Take kubetrain's log finalizer off the pods in `namespace`, as the operator does once it
    kept their logs (operator/archive.py): for teardowns after the operator stopped, and for
    tests that create pods without one."""
    from kubernetes import client

    for pod in core.list_namespaced_pod(namespace).items:
        held = pod.metadata.finalizers or []
        if naming.LOG_FINALIZER in held:
            kept = [f for f in held if f != naming.LOG_FINALIZER]
            try:
                core.patch_namespaced_pod(pod.metadata.name, namespace, {"metadata": {"finalizers": kept or None}})
            except client.ApiException as exc:
                if exc.status != 404:
                    raise


def condition(job: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in (job.get("status") or {}).get("conditions") or [] if c["type"] == kind), None)


def has_condition(kind: str, status: str = "True", reason: str | None = None) -> Callable[[dict[str, Any]], bool]:
    def check(job: dict[str, Any]) -> bool:
        c = condition(job, kind)
        return c is not None and c["status"] == status and (reason is None or c["reason"] == reason)

    return check


def api_error(exc: Any) -> tuple[str, list[str]]:
    """The Status message and the fields its causes name."""
    body = json.loads(exc.body or "{}")
    causes = body.get("details", {}).get("causes", [])
    return body.get("message", ""), [c.get("field", "") for c in causes]


def pod(name: str, **container: Any) -> dict[str, Any]:
    """A bare one-container Pod (busybox, `true`); `container` overrides its fields."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "busybox:1.36", "command": ["true"], **container}],
        },
    }


def owner_ref(api_version: str, kind: str, name: str, uid: str) -> dict[str, Any]:
    """A controller ownerReference that blocks its owner's deletion."""
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def gone(read: Any) -> bool:
    """Whether `read()` answers 404."""
    from kubernetes import client

    try:
        read()
    except client.ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


def phase_of(core: Any, namespace: str, name: str) -> Callable[[], str | None]:
    """A pod's phase once it has finished (for wait_for), else None."""

    def check() -> str | None:
        phase = core.read_namespaced_pod(name, namespace).status.phase
        return phase if phase in ("Succeeded", "Failed") else None

    return check
