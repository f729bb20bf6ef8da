"""The real Kueue controller-manager (sigs.k8s.io/kueue cmd/kueue, built by
tests/cluster/install.sh) against a test control plane, as a local process.

In a cluster Kueue runs behind a Service with certificates it makes itself; here there is no
kube-proxy, so its webhook server listens on 127.0.0.1 with a certificate from the control
plane's test CA, and its webhook configurations call that URL (`clientConfig.url`). Only the
webhooks of Kueue's own kinds are registered: the job integrations stay off, and TrainingJob
is an external framework (`integrations.externalFrameworks`), driven by the kubetrain
operator. It runs with the admin kubeconfig, so it needs no RBAC of its own.

    with kueue.running(cp) as kueue_proc:   # CRDs applied, webhooks registered, ready
        ...
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kubetrain.operator.kueue import EXTERNAL_FRAMEWORK, GROUP
from support import controlplane
from support.controlplane import ControlPlane, Unavailable, free_ports
from support.daemons import die_with_parent
from support.waiting import http_ok, wait_for


def find_kueue() -> Path:
    """The cache directory install.sh filled: the `kueue` binary, crds/ and webhooks.yaml."""
    version = controlplane.pinned("KUEUE_VERSION")
    directory = controlplane.cache_dir() / f"kueue-{version}"
    if not (directory / ".complete").exists():
        raise Unavailable(f"Kueue {version} is not built: run tests/cluster/install.sh ({directory} is missing)")
    return directory


def configuration(webhook_port: int, health_port: int, metrics_port: int, cert_dir: Path) -> dict[str, Any]:
    """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2) for one local process."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": "kueue-system",
        "manageJobsWithoutQueueName": False,
        "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}"},
        "leaderElection": {"leaderElect": False},
        # Kueue's own integrations stay at its default (batch/job, whose webhook is not
        # registered here); TrainingJob is driven by the kubetrain operator.
        "integrations": {"externalFrameworks": [EXTERNAL_FRAMEWORK]},
        # The on-demand visibility API is an aggregated apiserver this setup cannot route to.
        "featureGates": {"VisibilityOnDemand": False},
    }


def webhook_configurations(manifests: str, base_url: str, ca_bundle: str) -> list[dict[str, Any]]:
    """Kueue's webhook configurations, reduced to its own kinds and pointed at `base_url`."""
    documents = []
    for doc in yaml.safe_load_all(manifests):
        if not doc:
            continue
        hooks = [h for h in doc["webhooks"] if all(g == GROUP for r in h["rules"] for g in r["apiGroups"])]
        for hook in hooks:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": base_url + path, "caBundle": ca_bundle}
        doc["metadata"]["name"] = "kueue-" + doc["metadata"]["name"]
        documents.append({**doc, "webhooks": hooks})
    return documents


@dataclass
class KueueProcess:
    proc: subprocess.Popen[bytes]
    log: Path
    health_port: int

    def describe_failure(self, tail_lines: int = 40) -> str:
        lines = self.log.read_text(errors="replace").splitlines()[-tail_lines:]
        return f"--- Kueue log {self.log} (last {len(lines)} lines)\n" + "\n".join(lines)

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"kueue exited with {self.proc.returncode}\n{self.describe_failure()}")
        return http_ok(f"http://127.0.0.1:{self.health_port}/readyz")

    def stop(self, grace: float = 10) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=grace)


def _install(cp: ControlPlane, directory: Path, webhook_port: int) -> None:
    """Kueue's CRDs (Established) and its webhook configurations."""
    cp.kubectl("apply", "--server-side", "-f", str(directory / "crds"))
    jsonpath = "jsonpath={.items[*].status.conditions[?(@.type=='Established')].status}"
    crds = [f"{p.stem.split('_', 1)[1]}.{GROUP}" for p in sorted((directory / "crds").glob("*.yaml"))]

    def established() -> bool:
        got = cp.kubectl("get", "crd", *crds, "-o", jsonpath, check=False)
        return got.returncode == 0 and got.stdout.split() == ["True"] * len(crds)

    wait_for(established, 60, "Kueue's CRDs Established")
    ca_bundle = base64.b64encode((cp.workdir / "pki" / "ca.crt").read_bytes()).decode()
    hooks = webhook_configurations(
        (directory / "webhooks.yaml").read_text(), f"https://127.0.0.1:{webhook_port}", ca_bundle
    )
    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(hooks))
    cp.kubectl("create", "namespace", "kueue-system", check=False)


def start(cp: ControlPlane, timeout: float = 90) -> KueueProcess:
    """Install Kueue's CRDs and webhooks into `cp`, start its controller-manager, return once
    /readyz answers (the webhook server serves). Raises Unavailable when it is not built."""
    directory = find_kueue()
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        raise Unavailable(
            "Kueue's metrics certificate path is fixed (/etc/kueue/metrics/certs): running it needs root and unshare"
        )
    workdir = cp.workdir / "kueue"
    # The webhook's and the metrics server's certificate, signed by the control plane's CA for 127.0.0.1.
    ext = "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1\n"
    controlplane._signed_cert("kueue-serving", "/CN=kueue", ext, cp.workdir / "pki")
    cert_dir, etc = workdir / "certs", workdir / "etc"
    for folder in (cert_dir, etc / "upper" / "kueue" / "metrics" / "certs"):
        folder.mkdir(parents=True)
        for source, target in (("kueue-serving.crt", "tls.crt"), ("kueue-serving.key", "tls.key")):
            (folder / target).write_bytes((cp.workdir / "pki" / source).read_bytes())
    (etc / "work").mkdir()
    webhook_port, health_port, metrics_port = free_ports(3)
    config = workdir / "config.yaml"
    config.write_text(yaml.safe_dump(configuration(webhook_port, health_port, metrics_port, cert_dir)))
    _install(cp, directory, webhook_port)
    # Without internal cert management Kueue reads its metrics certificate from a fixed path
    # under /etc. It gets that path from an overlay on /etc in a mount namespace of its own:
    # the host's /etc is never touched.
    overlay = f"lowerdir=/etc,upperdir={etc / 'upper'},workdir={etc / 'work'}"
    argv = [str(directory / "kueue"), f"--config={config}", "--zap-log-level=2"]
    mount_then_exec = 'mount -t overlay kueue-etc -o "$0" /etc && exec "$@"'
    log = cp.logs / "kueue.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", mount_then_exec, overlay, *argv],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={"KUBECONFIG": str(cp.kubeconfig), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
            preexec_fn=die_with_parent,
        )
    kueue = KueueProcess(proc, log, health_port)
    started = time.monotonic()
    try:
        wait_for(kueue.ready, timeout, f"Kueue's /readyz (log: {log})")
    except BaseException:
        kueue.stop()
        raise
    print(f"Kueue ready in {time.monotonic() - started:.1f} s; log {log}")
    return kueue


@contextlib.contextmanager
def running(cp: ControlPlane) -> Iterator[KueueProcess]:
    kueue = start(cp)
    try:
        yield kueue
    finally:
        kueue.stop()
