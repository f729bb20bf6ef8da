"""What `Job.wait(progress=True)` shows, from `status.progress` (rank 0's latest metrics as the
operator or the local supervisor folds them): a rich bar on a terminal, an HTML bar updated in
place in a Jupyter notebook (IPython's own display, no widget library), nothing elsewhere (a
pipe, a CI log). `line` is the pure part."""

from __future__ import annotations

import html
import sys
from typing import IO, Any, Protocol

from kubetrain.api.models import TrainingJobStatus


def line(name: str, status: TrainingJobStatus) -> str:
    """`NAME Running · step 120/264 (45%) · epoch 2 · loss 0.2345 · accuracy 0.9500 · 812 samples/s · restarts 1`"""
    parts = [f"{name} {status.phase or 'Pending'}"]
    progress = status.progress
    if progress is not None:
        if progress.step is not None:
            total = f"/{progress.total_steps}" if progress.total_steps else ""
            percent = f" ({progress.percent}%)" if progress.percent is not None else ""
            parts.append(f"step {progress.step}{total}{percent}")
        if progress.epoch is not None:
            parts.append(f"epoch {progress.epoch}")
        if progress.loss is not None:
            parts.append(f"loss {progress.loss:.4f}")
        if progress.accuracy is not None:
            parts.append(f"accuracy {progress.accuracy:.4f}")
        if progress.samples_per_second is not None:
            parts.append(f"{progress.samples_per_second:.0f} samples/s")
    restarts = status.restarts + status.uncounted_restarts
    if restarts:
        parts.append(f"restarts {restarts}")
    return " · ".join(parts)


def fraction(status: TrainingJobStatus) -> tuple[int, int | None]:
    """(steps done, steps planned or None)."""
    progress = status.progress
    if progress is None or progress.step is None:
        return 0, None
    return progress.step, progress.total_steps or None


class Display(Protocol):
    def update(self, name: str, status: TrainingJobStatus) -> None: ...
    def close(self) -> None: ...


class NoDisplay:
    def update(self, name: str, status: TrainingJobStatus) -> None:
        pass

    def close(self) -> None:
        pass


class TerminalBar:
    """rich's progress bar on `stream` (stderr), the status line beside it."""

    def __init__(self, stream: IO[str], *, force_terminal: bool | None = None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        console = Console(file=stream, force_terminal=force_terminal)
        self.progress = Progress(
            BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.description}"), console=console
        )
        self.task = self.progress.add_task("", total=None)
        self.progress.start()

    def update(self, name: str, status: TrainingJobStatus) -> None:
        done, total = fraction(status)
        self.progress.update(self.task, completed=done, total=total, description=line(name, status))

    def close(self) -> None:
        self.progress.stop()


class NotebookBar:
    """An HTML <progress> and the status line, redrawn in place through IPython's display handle."""

    def __init__(self) -> None:
        from IPython.display import HTML, display

        self._html = HTML
        self.handle: Any = display(HTML(""), display_id=True)

    def update(self, name: str, status: TrainingJobStatus) -> None:
        done, total = fraction(status)
        bar = f'<progress value="{done}" max="{total}"></progress>' if total else "<progress></progress>"
        self.handle.update(self._html(f"{bar} <code>{html.escape(line(name, status))}</code>"))

    def close(self) -> None:
        pass


def in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel (IPython already imported: never imported here)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def make_display(progress: bool, stream: IO[str] | None = None) -> Display:
    if not progress:
        return NoDisplay()
    if in_notebook():
        return NotebookBar()
    stream = stream or sys.stderr
    if stream.isatty():
        return TerminalBar(stream)
    return NoDisplay()
