"""Helpers of the operator's control-plane tests: the operator as a real `kubetrain operator`
subprocess, and small readers and writers of the server's objects."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cluster.controlplane import free_ports, wait_for

from kubetrain.operator import naming

KUBETRAIN = Path(sys.executable).parent / "kubetrain"


class OperatorProcess:
    """`kubetrain operator` in a subprocess; its output goes to `log_path`."""

    def __init__(self, kubeconfig: Path, log_path: Path, namespaces: str = "", **flags: Any) -> None:
        self.kubeconfig, self.log_path, self.namespaces, self.flags = kubeconfig, log_path, namespaces, flags
        self.proc: subprocess.Popen[bytes] | None = None
        self.health_port = self.metrics_port = 0

    def start(self, wait: bool = True) -> OperatorProcess:
        self.health_port, self.metrics_port = free_ports(2)
        args = [
            str(KUBETRAIN),
            "operator",
            f"--namespaces={self.namespaces}",
            f"--health-port={self.health_port}",
            f"--metrics-port={self.metrics_port}",
            "--log-format=plain",
            "--progress-interval=2",
            *(f"--{key.replace('_', '-')}={value}" for key, value in self.flags.items()),
        ]
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        with self.log_path.open("ab") as log:
            log.write(f"\n=== start {time.strftime('%H:%M:%S')} {' '.join(args)}\n".encode())
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        if wait:
            wait_for(self.healthy, 30, f"the operator's /healthz (log: {self.log_path})")
        return self

    def healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"the operator exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=1) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            text: str = response.read().decode()
            return text

    def kill(self) -> None:
        """SIGKILL: no cleanup, as an OOM kill or a node loss would do."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


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

    def wait_pods(self, job: str, count: int, attempt: int | None = None, timeout: float = 30) -> list[Any]:
        def check() -> list[Any] | None:
            pods = self.live_pods(job, attempt)
            return pods if len(pods) == count else None

        result: list[Any] = wait_for(check, timeout, f"{count} live pods of {job} (attempt {attempt})", interval=0.1)
        return result


def condition(job: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in (job.get("status") or {}).get("conditions") or [] if c["type"] == kind), None)


def has_condition(kind: str, status: str = "True", reason: str | None = None) -> Callable[[dict[str, Any]], bool]:
    def check(job: dict[str, Any]) -> bool:
        c = condition(job, kind)
        return c is not None and c["status"] == status and (reason is None or c["reason"] == reason)

    return check
