"""`kubetrain operator` as a real subprocess, for every test that needs the operator running
against the test control plane."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from support.controlplane import free_ports
from support.waiting import http_ok, wait_for

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
        return http_ok(f"http://127.0.0.1:{self.health_port}/healthz")

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
