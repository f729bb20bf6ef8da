"""Playing the kubelet: the control plane has no nodes, so tests move pods through their
lifecycle by writing what a kubelet would (a Node, a Binding, then pod status through the
status subresource): Pending -> Running -> Succeeded / Failed with exit codes.

    kubelet = FakeKubelet(api_client)
    kubelet.run(ns, "job-node-0")            # bound to the fake node, Running, Ready
    kubelet.succeed(ns, "job-node-0")        # exitCode 0, phase Succeeded
    kubelet.fail(ns, "job-node-1", exit_code=137, reason="OOMKilled")
    kubelet.confirm_deletion(ns, "job-node-0")   # after a delete: what ends Terminating
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from kubernetes import client

NODE_NAME = "kubetrain-fake-node"


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_manifest(name: str, *, cpu: str = "64", memory: str = "256Gi", gpus: int = 8) -> dict[str, Any]:
    capacity = {"cpu": cpu, "memory": memory, "pods": "110", "nvidia.com/gpu": str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}},
        "status": {"capacity": capacity, "allocatable": capacity},
    }


def _condition(kind: str, status: str, reason: str = "", message: str = "") -> dict[str, Any]:
    cond = {"type": kind, "status": status, "lastTransitionTime": now(), "lastProbeTime": None}
    if reason:
        cond["reason"] = reason
    if message:
        cond["message"] = message
    return cond


def schedulable_node(core: Any, name: str, *, cpu: str, gpus: int = 0) -> None:
    """A Ready Node with `cpu` and `gpus` allocatable for a real kube-scheduler to bind pods to
    (nothing runs them: FakeKubelet writes their status). The API server taints a new Node
    not-ready; the node-lifecycle controller, not run here, would lift that."""
    core.create_node(node_manifest(name, cpu=cpu, gpus=gpus))
    core.patch_node_status(name, {"status": {"conditions": [_condition("Ready", "True", "KubeletReady")]}})
    core.patch_node(name, {"spec": {"taints": None}})


class FakeKubelet:
    """Writes the status a kubelet on node `node_name` would write. Every method patches
    through the real API server, so its validation of status updates applies (a pod in a
    terminal phase cannot become Running again, for instance)."""

    def __init__(self, api_client: Any, node_name: str = NODE_NAME, pod_ip: str = "127.0.0.1") -> None:
        self.core = client.CoreV1Api(api_client)
        self.node_name = node_name
        self.pod_ip = pod_ip

    # --- node ----------------------------------------------------------------------------
    def ensure_node(self) -> None:
        """Create the Node (idempotent) and mark it Ready."""
        try:
            self.core.create_node(node_manifest(self.node_name))
        except client.ApiException as exc:
            if exc.status != 409:
                raise
        conditions = [_condition("Ready", "True", "KubeletReady", "kubetrain FakeKubelet")]
        self.core.patch_node_status(self.node_name, {"status": {"conditions": conditions}})

    # --- pods ----------------------------------------------------------------------------
    def bind(self, namespace: str, name: str) -> None:
        """Schedule the pod onto the fake node, as kube-scheduler would (no-op if bound)."""
        pod = self.core.read_namespaced_pod(name, namespace)
        if pod.spec.node_name:
            return
        self.ensure_node()
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": self.node_name},
        }
        # The generated client fails to deserialize the Status a Binding answers with;
        # _preload_content=False skips that.
        self.core.create_namespaced_binding(namespace, body, _preload_content=False)

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> Any:
        """Merge `status` into the pod's status through the status subresource."""
        return self.core.patch_namespaced_pod_status(name, namespace, {"status": status})

    def _report(self, namespace: str, pod: Any, started: str, terminated: dict[str, Any] | None, ready: bool) -> Any:
        """What a kubelet writes: every container running since `started`, or `terminated`
        (phase Succeeded with exit code 0, else Failed)."""
        if terminated is None:
            phase, reason = "Running", ""
        else:
            phase, reason = ("Succeeded" if terminated["exitCode"] == 0 else "Failed"), "PodCompleted"
        flag = "True" if ready else "False"
        statuses = []
        for c in pod.spec.containers:
            container_id = f"fake://{namespace}/{pod.metadata.name}/{c.name}"
            state = (
                {"running": {"startedAt": started}}
                if terminated is None
                else {"terminated": {**terminated, "containerID": container_id}}
            )
            statuses.append(
                {
                    "name": c.name,
                    "image": c.image,
                    "imageID": f"fake://{c.image}",
                    "containerID": container_id,
                    "ready": ready,
                    "started": terminated is None,
                    "restartCount": 0,
                    "state": state,
                }
            )
        return self.patch_status(
            namespace,
            pod.metadata.name,
            {
                "phase": phase,
                "hostIP": self.pod_ip,
                "podIP": self.pod_ip,
                "podIPs": [{"ip": self.pod_ip}],
                "startTime": started,
                "conditions": [
                    _condition("PodScheduled", "True"),
                    _condition("Initialized", "True"),
                    _condition("ContainersReady", flag, reason),
                    _condition("Ready", flag, reason),
                ],
                "containerStatuses": statuses,
            },
        )

    def run(self, namespace: str, name: str, *, ready: bool = True) -> Any:
        """Bind the pod and report it Running with every container started."""
        self.bind(namespace, name)
        return self._report(namespace, self.core.read_namespaced_pod(name, namespace), now(), None, ready)

    def terminate(self, namespace: str, name: str, *, exit_code: int, reason: str | None = None) -> Any:
        """Report every container terminated with `exit_code` (restartPolicy Never semantics,
        which is what training pods use)."""
        self.bind(namespace, name)
        pod = self.core.read_namespaced_pod(name, namespace)
        finished = now()
        started = pod.status.start_time.strftime("%Y-%m-%dT%H:%M:%SZ") if pod.status.start_time else finished
        terminated = {
            "exitCode": exit_code,
            "reason": reason or ("Completed" if exit_code == 0 else "Error"),
            "startedAt": started,
            "finishedAt": finished,
        }
        return self._report(namespace, pod, started, terminated, ready=False)

    def succeed(self, namespace: str, name: str) -> Any:
        return self.terminate(namespace, name, exit_code=0)

    def fail(self, namespace: str, name: str, *, exit_code: int = 1, reason: str = "Error") -> Any:
        return self.terminate(namespace, name, exit_code=exit_code, reason=reason)

    def evict(self, namespace: str, name: str, *, reason: str = "Evicted", message: str = "") -> Any:
        """Phase Failed with a pod-level reason and no exit code, as a node-pressure eviction."""
        return self.patch_status(
            namespace, name, {"phase": "Failed", "reason": reason, "message": message or f"fake {reason}"}
        )

    def confirm_deletion(self, namespace: str, name: str, uid: str | None = None) -> None:
        """Finish a graceful deletion as the kubelet does once the containers stopped: a pod
        bound to a node otherwise stays Terminating for good. `uid` pins the pod meant (a
        successor of the same name must live); a pod already gone is fine."""
        try:
            if uid is None:
                uid = self.core.read_namespaced_pod(name, namespace).metadata.uid
            # With a body the server reads the options from it, not from query parameters.
            options = client.V1DeleteOptions(grace_period_seconds=0, preconditions={"uid": uid})
            self.core.delete_namespaced_pod(name, namespace, body=options)
        except client.ApiException as exc:
            if exc.status not in (404, 409):
                raise

    def confirm_deletions(self, namespace: str) -> None:
        """`confirm_deletion` of every pod in `namespace` that is being deleted."""
        for pod in self.core.list_namespaced_pod(namespace).items:
            if pod.metadata.deletion_timestamp is not None:
                self.confirm_deletion(namespace, pod.metadata.name, pod.metadata.uid)
