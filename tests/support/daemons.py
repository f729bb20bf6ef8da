"""What the control plane (support.controlplane.ControlPlane) and the real node
(support.realnode.RealNode) share: long-running processes, started by name, each writing to
`logs/<name>.log` under `workdir` and dying with the test session; waited on while they stay up;
stopped by name or all of them, newest first; and the tails of their logs for an error message."""

from __future__ import annotations

import contextlib
import ctypes
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from support.waiting import wait_for

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In the child before exec (`preexec_fn`). A pytest killed with SIGKILL must not leave an
    apiserver behind: the kernel sends SIGTERM to the child when the parent dies. Linux only,
    and best effort elsewhere."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Daemons:
    """Processes started by name under `workdir` (their logs in `workdir/logs`); `timings` for
    what a subclass measures. The subclass's fields follow `workdir`."""

    workdir: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, kw_only=True)
    timings: dict[str, float] = field(default_factory=dict, kw_only=True)

    @property
    def logs(self) -> Path:
        return self.workdir / "logs"

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        """Start `name` (again, after a kill: its log goes on)."""
        with (self.logs / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                preexec_fn=die_with_parent if sys.platform == "linux" else None,
            )
        self.processes[name] = proc
        return proc

    def describe_failure(self, tail_lines: int = 25) -> str:
        """Why a start failed: the subclass's account (its logs' tails, its state)."""
        return "\n".join(self.log_tails(tail_lines))

    def stop(self, grace: float = 10) -> None:
        self._stop_all(grace)

    @contextlib.contextmanager
    def starting(self, what: str) -> Iterator[None]:
        """A start: if the block fails, stop what it started and raise with describe_failure()."""
        try:
            yield
        except BaseException as exc:
            detail = self.describe_failure()
            self.stop()
            if isinstance(exc, Exception):
                raise RuntimeError(f"{what} failed to start: {exc}\n{detail}") from exc
            raise

    def _check_alive(self) -> None:
        for name, proc in self.processes.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}")

    def _wait(self, what: str, ready: Callable[[], object], timeout: float, interval: float = 0.1) -> None:
        """Until `ready()` is true (an exception is "not yet"); RuntimeError as soon as one of
        the processes exits."""

        def check() -> bool:
            self._check_alive()
            with contextlib.suppress(Exception):
                return bool(ready())
            return False

        wait_for(check, timeout, what, interval=interval)

    def _stop_process(self, name: str, grace: float = 10) -> None:
        proc = self.processes.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=grace)

    def _stop_all(self, grace: float = 10) -> None:
        """Terminate what this object started, newest first (PIDs it holds; nothing else)."""
        for name in reversed(list(self.processes)):
            self._stop_process(name, grace)

    def log_tails(self, tail_lines: int) -> list[str]:
        """The last lines of each log, for an error message."""
        parts = []
        for log in sorted(self.logs.glob("*.log")):
            lines = log.read_text(errors="replace").splitlines()[-tail_lines:]
            parts.append(f"--- {log.name} (last {len(lines)} lines)\n" + "\n".join(lines))
        return parts
