"""`kubetrain operator` as a real subprocess, for every test and benchmark that needs the operator
running against the test control plane: `running_operator` (a context manager that stops it and
then checks that its log is clean) or `OperatorProcess` itself where a test kills, pauses and
restarts it.

Leader election is off unless a test asks for it (`leader_elect=True`, with a Lease of its own:
`lease_namespace`): tests that kill an operator and start the next at once would otherwise wait
out the dead one's Lease (docs/operator-ha.md)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from support.controlplane import free_ports
from support.daemons import die_with_parent
from support.waiting import http_ok, wait_for

TEST_AGENT_KEY = "kubetrain-tests-agent-key"

KUBETRAIN = Path(sys.executable).parent / "kubetrain"


def rbac_refusals(log: str) -> list[str]:
    """An authorization refusal reads 'is forbidden: User "..." cannot <verb> resource ...'.
    (Other 403s, such as jobs left in namespaces being deleted by earlier tests, are not RBAC.)"""
    return [line for line in log.splitlines() if "forbidden: User" in line or "cannot list" in line]


def assert_clean(log: str) -> None:
    """No traceback and no RBAC refusal: what every operator a test ran must leave."""
    refused = rbac_refusals(log)
    assert not refused, "\n".join(refused)
    assert "Traceback" not in log, log[-5000:]


class OperatorProcess:
    """`kubetrain operator` in a subprocess; its output goes to `log_path`. `flags` become
    command-line flags (`log_level="debug"` -> `--log-level=debug`; True/False -> `--x`/`--no-x`)."""

    def __init__(self, kubeconfig: Path, log_path: Path, namespaces: str = "", **flags: Any) -> None:
        self.kubeconfig, self.log_path, self.namespaces = kubeconfig, log_path, namespaces
        self.flags = {"leader_elect": False, **flags}
        self.proc: subprocess.Popen[bytes] | None = None
        self.health_port = self.metrics_port = 0

    def argv(self) -> list[str]:
        args = [
            str(KUBETRAIN),
            "operator",
            f"--namespaces={self.namespaces}",
            f"--health-port={self.health_port}",
            f"--metrics-port={self.metrics_port}",
            "--log-format=plain",
            "--progress-interval=2",
        ]
        for key, value in self.flags.items():
            flag = key.replace("_", "-")
            if isinstance(value, bool):
                args.append(f"--{flag}" if value else f"--no-{flag}")
            else:
                args.append(f"--{flag}={value}")
        return args

    def start(self, wait: bool = True) -> OperatorProcess:
        """Start it; `wait`: until /readyz answers (every job and child listed)."""
        self.health_port, self.metrics_port = free_ports(2)
        args = self.argv()
        # One key for every operator process of the tests, as the chart gives every replica one:
        # a restarted or standby operator signs in-place orders the running pods take.
        self._spawn(args, {"KUBETRAIN_AGENT_KEY": TEST_AGENT_KEY, **os.environ})
        if wait:
            wait_for(self.ready, 30, f"the operator's /readyz (log: {self.log_path})")
        return self

    def start_deployed(self, args: list[str], env: dict[str, str]) -> OperatorProcess:
        """Start it as a Deployment's container runs: `args` after the command, configured by `env`
        alone (none of this process's KUBETRAIN_* settings, no in-cluster API address), its probes'
        ports read from `env` as the kubelet's are from the pod spec; until /readyz answers."""
        self.health_port = int(env["KUBETRAIN_HEALTH_PORT"])
        self.metrics_port = int(env["KUBETRAIN_METRICS_PORT"])
        args = [str(KUBETRAIN), *args]
        outside = {k: v for k, v in os.environ.items() if not k.startswith("KUBETRAIN_")}
        outside.pop("KUBERNETES_SERVICE_HOST", None)
        self._spawn(args, {**outside, **env})
        wait_for(self.ready, 60, f"the operator's /readyz (the probes' path and port; log: {self.log_path})")
        return self

    def _spawn(self, args: list[str], env: dict[str, str]) -> None:
        """`args` with `env` (and this control plane's kubeconfig), appending to the log."""
        with self.log_path.open("ab") as log:
            log.write(f"\n=== start {time.strftime('%H:%M:%S')} {' '.join(args)}\n".encode())
            env = {**env, "KUBECONFIG": str(self.kubeconfig)}
            # A test or benchmark killed without its teardown must not leave the operator running.
            self.proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=die_with_parent
            )

    def _probe(self, path: str) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"the operator exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
        return http_ok(f"http://127.0.0.1:{self.health_port}/{path}")

    def healthy(self) -> bool:
        return self._probe("healthz")

    def ready(self) -> bool:
        return self._probe("readyz")

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            text: str = response.read().decode()
            return text

    def leading(self) -> bool:
        """The `kubetrain_leader` gauge."""
        found = re.search(r"^kubetrain_leader (\S+)$", self.metrics(), re.MULTILINE)
        return found is not None and float(found.group(1)) == 1.0

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def signal(self, sig: signal.Signals) -> None:
        """SIGSTOP / SIGCONT / SIGTERM without waiting (the process must be running)."""
        assert self.proc is not None and self.proc.poll() is None
        self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL: no cleanup, as an OOM kill or a node loss would do."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a paused one would not see the SIGTERM
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextlib.contextmanager
def running_operator(kubeconfig: Path, log_path: Path, namespaces: str = "", **flags: Any) -> Iterator[OperatorProcess]:
    """The operator, ready, for the block; then stopped, and its log checked (`assert_clean`)
    unless the block failed (its own error says more)."""
    proc = OperatorProcess(kubeconfig, log_path, namespaces, **flags)
    try:
        yield proc.start()
    finally:
        proc.stop()
    assert_clean(proc.log())
