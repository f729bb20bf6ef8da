"""The operators a benchmark can measure on one control plane, behind one interface: kubetrain's
(`kubetrain operator`) and the Kubeflow Training Operator (the peer, built by
tests/cluster/install.sh from its Go module).

Each peer knows how to start itself against a kubeconfig watching one namespace, what a job of
`nodes` nodes looks like for it, which label names a child's job, how many children a job has,
and its process (for CPU and RSS). Both run without registering any admission webhook.
"""

from __future__ import annotations

import contextlib
import fcntl
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from support import controlplane  # noqa: E402
from support.operator_process import OperatorProcess  # noqa: E402
from support.waiting import http_ok, wait_for  # noqa: E402

from kubetrain.api import naming  # noqa: E402

IMAGE = "kubetrain/trainer:bench"

# Fixed by the Kubeflow binary (pkg/cert: certDir, defaultOperatorNamespace and the default of
# --webhook-secret-name): out of a cluster it reads the Secret from namespace "kubeflow" and
# serves its webhook from this directory, whatever the flags say.
KUBEFLOW_CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")
KUBEFLOW_NAMESPACE = "kubeflow"
KUBEFLOW_SECRET = "training-operator-webhook-cert"
KUBEFLOW_JOB_LABEL = "training.kubeflow.org/job-name"


class Peer(Protocol):
    name: str
    job_label: str

    def crds(self) -> Path: ...
    def children_per_job(self, nodes: int) -> int: ...
    def job(self, name: str, nodes: int) -> tuple[tuple[str, str, str], dict[str, Any]]: ...
    def start(self, cp: Any, namespace: str, log_path: Path) -> None: ...
    def pid(self) -> int: ...
    def stop(self) -> None: ...


class KubetrainPeer:
    """`kubetrain operator`: one headless Service + one pod per node."""

    name = "kubetrain"
    job_label = naming.LABEL_JOB

    def __init__(self) -> None:
        self.proc: OperatorProcess | None = None

    def crds(self) -> Path:
        return ROOT / "crds"

    def children_per_job(self, nodes: int) -> int:
        return nodes + 1

    def job(self, name: str, nodes: int) -> tuple[tuple[str, str, str], dict[str, Any]]:
        body = {
            "apiVersion": naming.API_VERSION,
            "kind": naming.KIND,
            "metadata": {"name": name},
            "spec": {"nodes": nodes, "image": IMAGE},
        }
        return (naming.GROUP, naming.VERSION, naming.PLURAL), body

    def start(self, cp: Any, namespace: str, log_path: Path) -> None:
        self.proc = OperatorProcess(cp.kubeconfig, log_path, namespaces=namespace).start()

    def pid(self) -> int:
        assert self.proc is not None and self.proc.proc is not None
        return self.proc.proc.pid

    def metrics(self) -> str:
        assert self.proc is not None
        return self.proc.metrics()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()


def kubeflow_dir() -> Path:
    return controlplane.cache_dir() / f"kubeflow-training-operator-{controlplane.pinned('KUBEFLOW_VERSION')}"


@contextlib.contextmanager
def _cert_dir_lock() -> Iterator[None]:
    # The serving-cert path is fixed: two Kubeflow operators at once (a smoke test beside a
    # benchmark) would overwrite each other's certificates.
    KUBEFLOW_CERT_DIR.mkdir(parents=True, exist_ok=True)
    with (KUBEFLOW_CERT_DIR.parent / ".kubetrain-benchmark.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@dataclass
class KubeflowPeer:
    """Kubeflow Training Operator v1 (PyTorchJob only): Master 1 + Worker nodes-1, one pod and one
    Service per replica. `qps`/`burst`/`threads` are its --kube-api-qps, --kube-api-burst and
    --controller-threads (shipped defaults 20, 30, 1)."""

    qps: int = 20
    burst: int = 30
    threads: int = 1
    label: str = "kubeflow"
    job_label: str = KUBEFLOW_JOB_LABEL
    proc: subprocess.Popen[bytes] | None = None
    _lock: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    @property
    def name(self) -> str:
        return self.label

    def crds(self) -> Path:
        return kubeflow_dir() / "crds"

    def children_per_job(self, nodes: int) -> int:
        return 2 * nodes

    def job(self, name: str, nodes: int) -> tuple[tuple[str, str, str], dict[str, Any]]:
        def replicas(count: int) -> dict[str, Any]:
            container = {"name": "pytorch", "image": IMAGE}
            return {"replicas": count, "restartPolicy": "Never", "template": {"spec": {"containers": [container]}}}

        specs = {"Master": replicas(1)} | ({"Worker": replicas(nodes - 1)} if nodes > 1 else {})
        body = {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {"name": name},
            "spec": {"pytorchReplicaSpecs": specs},
        }
        return ("kubeflow.org", "v1", "pytorchjobs"), body

    def start(self, cp: Any, namespace: str, log_path: Path) -> None:
        binary = kubeflow_dir() / "training-operator"
        if not (kubeflow_dir() / ".complete").exists():
            raise controlplane.Unavailable(f"{binary} is not built: run tests/cluster/install.sh")
        self._prepare(cp)
        self._lock.enter_context(_cert_dir_lock())
        self._write_serving_cert()
        metrics, health, webhook = controlplane.free_ports(3)
        args = [
            str(binary),
            f"--namespace={namespace}",
            "--enable-scheme=pytorchjob",
            f"--metrics-bind-address=127.0.0.1:{metrics}",
            f"--health-probe-bind-address=127.0.0.1:{health}",
            f"--webhook-server-port={webhook}",
            f"--kube-api-qps={self.qps}",
            f"--kube-api-burst={self.burst}",
            f"--controller-threads={self.threads}",
            f"--kubeconfig={cp.kubeconfig}",
        ]
        with log_path.open("ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)

        def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"training-operator exited {self.proc.returncode}: see {log_path}")
            return http_ok(f"http://127.0.0.1:{health}/readyz")

        wait_for(ready, 60, f"training-operator's /readyz (log: {log_path})")

    def _prepare(self, cp: Any) -> None:
        """The namespace and the empty Secret that its cert rotator fills (idempotent)."""
        for args in (
            ("create", "namespace", KUBEFLOW_NAMESPACE),
            ("create", "secret", "generic", KUBEFLOW_SECRET, "-n", KUBEFLOW_NAMESPACE),
        ):
            done = cp.kubectl(*args, check=False)
            if done.returncode and "already exists" not in done.stderr:
                raise RuntimeError(f"kubectl {' '.join(args)}: {done.stderr}")

    def _write_serving_cert(self) -> None:
        # The webhook server reads these before the rotator has written its own.
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", "tls.key", "-out", "tls.crt", "-days", "1", "-subj", "/CN=training-operator"],
            cwd=KUBEFLOW_CERT_DIR, check=True, capture_output=True,
        )  # fmt: skip

    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> None:
        """SIGTERM. v1.9.3 panics on it (`close of closed channel` in main's deferred close,
        after its manager stopped): the exit status is ignored, the data is taken before."""
        try:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(15)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(10)
        finally:
            self._lock.close()


def peers(names: list[str]) -> list[Peer]:
    """Fresh peers for one round, by name: kubetrain, kubeflow (as shipped), kubeflow-tuned."""
    table: dict[str, Any] = {
        "kubetrain": KubetrainPeer,
        "kubeflow": lambda: KubeflowPeer(),
        # As issue 15 measured it: client QPS 1000 (burst as much) and 32 reconcile workers.
        "kubeflow-tuned": lambda: KubeflowPeer(qps=1000, burst=1000, threads=32, label="kubeflow-tuned"),
    }
    return [table[name]() for name in names]
