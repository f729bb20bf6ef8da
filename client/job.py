"""`Job`: a handle on one TrainingJob, the same on both backends: its status, waiting for it,
its logs (read by `kubetrain logs`' own code, so the lines and `[node-i]` prefixes are that
command's) and rank 0's metrics records."""

from __future__ import annotations

import io
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Literal, overload

from kubetrain.api.models import TrainingJob, TrainingJobStatus
from kubetrain.api.records import metrics_in
from kubetrain.client.backend import Backend
from kubetrain.client.errors import JobFailed, LogsUnavailable, WaitTimeout
from kubetrain.client.logs import LogsError, LogSource, attempt_logs, run_logs
from kubetrain.client.progress import Display, make_display

log = logging.getLogger("kubetrain.client")


def finished(status: TrainingJobStatus) -> Literal["Succeeded", "Failed"] | None:
    """The job's outcome once its Succeeded or Failed condition is True."""
    outcomes: tuple[Literal["Succeeded", "Failed"], ...] = ("Succeeded", "Failed")
    for outcome in outcomes:
        if any(c.type == outcome and c.status == "True" for c in status.conditions or []):
            return outcome
    return None


class _Lines(io.StringIO):
    """A text stream handing each complete line (without its end) to `send`."""

    def __init__(self, send: Callable[[str], None]) -> None:
        super().__init__()
        self.send = send
        self.partial = ""

    def write(self, text: str) -> int:
        *lines, self.partial = (self.partial + text).split("\n")
        for one in lines:
            self.send(one)
        return len(text)


class Job:
    """A TrainingJob, by name, on the backend its Client talks to."""

    def __init__(self, backend: Backend, name: str) -> None:
        self._backend = backend
        self.name = name

    @property
    def namespace(self) -> str:
        """The namespace (locally: the directory holding the run directories)."""
        return self._backend.namespace

    def __repr__(self) -> str:
        return f"Job({self.name!r}, namespace={self.namespace!r}, backend={self._backend.kind!r})"

    def get(self) -> TrainingJob:
        """The whole TrainingJob (spec and status) as it is now."""
        return self._backend.get(self.name)

    def status(self) -> TrainingJobStatus:
        """The typed status (`.phase`, `.conditions`, `.progress`, `.failures`, ...)."""
        return self._backend.status(self.name)

    def wait(
        self, timeout: float | None = None, progress: bool = True, *, display: Display | None = None
    ) -> TrainingJobStatus:
        """Block until the job succeeds (its status is returned) or fails (JobFailed, holding the
        status with its Failed condition and failures). `timeout` seconds: WaitTimeout, the job
        goes on. `progress`: a progress bar from status.progress on a terminal or in a notebook."""
        deadline = None if timeout is None else time.monotonic() + timeout
        shown = display or make_display(progress)
        try:
            while True:
                status = self.status()
                shown.update(self.name, status)
                outcome = finished(status)
                if outcome is not None:
                    self._backend.settle(self.name)
                    status = self.status()  # as the runner left it (locally: after its last write)
                    if outcome == "Failed":
                        raise JobFailed(self.name, status)
                    return status
                self._backend.ensure_live(self.name)
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise WaitTimeout(
                        f"trainingjob {self.name} is still {status.phase or 'Pending'} after {timeout:g} s"
                    )
                time.sleep(self._backend.poll_s if left is None else min(self._backend.poll_s, left))
        finally:
            shown.close()

    # --- logs and metrics -----------------------------------------------------------------------

    @overload
    def logs(
        self,
        follow: Literal[False] = False,
        attempt: int | None = None,
        rank: int | None = None,
        tail: int | None = None,
    ) -> list[str]: ...

    @overload
    def logs(
        self, follow: Literal[True], attempt: int | None = None, rank: int | None = None, tail: int | None = None
    ) -> Iterator[str]: ...

    def logs(
        self, follow: bool = False, attempt: int | None = None, rank: int | None = None, tail: int | None = None
    ) -> list[str] | Iterator[str]:
        """The lines `kubetrain logs` prints, `[node-i]`-prefixed, node by node: every node's log of
        the current attempt, or of `attempt` (`--attempt`: from its pods while they exist, else from
        its log archive), or only node `rank`'s. `follow`: an iterator of the lines as they come,
        `[attempt N node-i]`-prefixed, across gang restarts until the job ends (`-f`). What that
        command says on stderr (a node without a log, how each followed log ended) goes to the
        `kubetrain.client` logger."""
        source = self._backend.log_source(self.name)
        if follow:
            return self._follow(source, attempt=attempt, rank=rank, tail=tail)
        lines: list[str] = []
        try:
            self._read(source, lines.append, follow=False, attempt=attempt, rank=rank, tail=tail)
        except LogsError as error:
            raise LogsUnavailable(str(error)) from None
        return lines

    def _read(
        self,
        source: LogSource,
        write: Callable[[str], None],
        *,
        follow: bool,
        attempt: int | None,
        rank: int | None,
        tail: int | None,
    ) -> None:
        """`kubetrain logs`' own read: each line it prints to `write`, what it says on stderr to the
        `kubetrain.client` logger."""
        run_logs(
            source,
            self.name,
            rank=rank,
            attempt=attempt,
            previous=False,
            follow=follow,
            tail=tail,
            out=_Lines(write),
            err=_Lines(log.warning),
        )

    def _follow(self, source: LogSource, *, attempt: int | None, rank: int | None, tail: int | None) -> Iterator[str]:
        lines: queue.Queue[str | None] = queue.Queue()
        failure: list[BaseException] = []

        def follow() -> None:
            try:
                self._read(source, lines.put, follow=True, attempt=attempt, rank=rank, tail=tail)
            except LogsError as error:
                failure.append(LogsUnavailable(str(error)))
            except Exception as error:  # raised in the caller's thread, below
                failure.append(error)
            finally:
                lines.put(None)

        threading.Thread(target=follow, name=f"kubetrain-logs-{self.name}", daemon=True).start()
        while (line := lines.get()) is not None:
            yield line
        if failure:
            raise failure[0]

    def metrics(self) -> list[dict[str, Any]]:
        """Rank 0's metrics records of the current attempt (`lib.log0`, the built-in trainer's),
        oldest first, as dicts: `pandas.DataFrame(job.metrics())`."""
        source = self._backend.log_source(self.name)
        try:
            read = attempt_logs(source, self.name, rank=0)
        except LogsError as error:
            raise LogsUnavailable(str(error)) from None
        if 0 not in read.logs:
            raise LogsUnavailable("; ".join(read.problems) or f"trainingjob {self.name}: node 0 has no log yet")
        return metrics_in(read.logs[0])

    def delete(self) -> None:
        """Delete the job: its pods stop and go (locally: its processes, then its run directory)."""
        self._backend.delete(self.name)
