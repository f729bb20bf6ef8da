"""What a local run shows: merged `[node-i]` output, rank 0's metrics as a live rich progress
bar on a terminal (plain lines otherwise), and the final summary."""

from __future__ import annotations

from collections.abc import Sequence
from typing import IO, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from kubetrain.api import naming
from kubetrain.local.localize import CREDENTIALS_FIELD, LOCAL_REWRITES
from kubetrain.local.plan import LocalPlan, NodeProcess, attempt_log
from kubetrain.local.result import RunResult


def _num(value: Any, fmt: str = ".4f") -> str:
    return "-" if value is None else format(value, fmt)


def header_lines(plan: LocalPlan) -> list[str]:
    spec = plan.job.spec
    lines = [
        f"{plan.job.name}: {spec.nodes} nodes x {spec.procs_per_node} "
        f"{'GPU' if spec.gpus_per_node else 'CPU'} process(es), run dir {plan.run_dir}",
        "local rewrites of the rendered pods (everything else as on a cluster):",
    ]
    lines += [f"  {names}: {how}" for names, how in LOCAL_REWRITES if _applies(plan, how)]
    return lines


def _applies(plan: LocalPlan, how: str) -> bool:
    """Whether a row of the rewrite table changes anything for this run."""
    if how.startswith("--netns only"):
        return plan.netns is not None
    if how.startswith(CREDENTIALS_FIELD):
        store = plan.job.spec.checkpoint.object_store
        return store is not None and store.credentials_secret is not None
    return True


def checkpoint_line(result: RunResult) -> str:
    """What kubetrain knows about checkpoints: only the `checkpoint` (and `resume`) records the job
    logged. A script that keeps its own checkpoints without them is not described as saving none."""
    if result.checkpoints_written:
        return f"{len(result.checkpoints_written)} written, last {result.checkpoints_written[-1]}"
    if result.last_checkpoint is not None:
        return f"none written in this run; resumed from {result.last_checkpoint.path}"
    return "none reported (the job logged no checkpoint records)"


def failure_line(result: RunResult) -> str | None:
    """The node that ended a failed run, its exit code and where its output is."""
    failure = result.node_failure
    if failure is None or failure.rank is None:
        return None
    code = "" if failure.exit_code is None else f" with exit code {failure.exit_code}"
    log = attempt_log(result.run_dir, failure.attempt, failure.rank)
    return f"node {failure.rank} failed{code} in attempt {failure.attempt} ({failure.reason}); its log: {log}"


def summary_lines(result: RunResult) -> list[str]:
    minutes, seconds = divmod(result.wall_s, 60)
    lines = [
        f"{result.outcome}" + (f" ({result.reason})" if result.reason and result.reason != result.outcome else ""),
        f"  time          {int(minutes)}m{seconds:04.1f}s"
        + ("" if result.first_step_s is None else f" (first step after {result.first_step_s:.1f}s)"),
        f"  final step    {_num(result.final_step, 'd')}",
        f"  final loss    {_num(result.final_loss)}",
        f"  accuracy      {_num(result.final_accuracy)}",
        f"  checkpoints   {checkpoint_line(result)}",
        f"  restarts      {result.restarts}",
        f"  run dir       {result.run_dir}",
    ]
    if result.plot:
        lines.append(f"  plot          {result.plot}")
    if (failed := failure_line(result)) is not None:
        lines.append(failed)
    return lines


class PlainView:
    """Line output for pipes, CI and tests: every record as a human line."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out

    def _print(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def begin(self, plan: LocalPlan) -> None:
        for line in header_lines(plan):
            self.notice(line)

    def attempt(self, attempt: int, nodes: Sequence[NodeProcess], pids: Sequence[int]) -> None:
        port = nodes[0].env.get("MASTER_PORT", "?")
        where = ", ".join(f"node-{n.rank} pid {pid}" for n, pid in zip(nodes, pids, strict=True))
        self.notice(f"attempt {attempt}: {where}; rendezvous {nodes[0].env.get('MASTER_ADDR')}:{port}")

    def output(self, rank: int, stream: str, text: str) -> None:
        self._print(naming.node_line(rank, text))

    def record(self, record: dict[str, Any]) -> None:
        # The trainer logs every record as a human line on stderr too; printing it again
        # would double the output. The raw records are in node-0.log and metrics.jsonl.
        pass

    def notice(self, text: str) -> None:
        self._print(f"[kubetrain] {text}")

    def end(self, result: RunResult) -> None:
        for line in summary_lines(result):
            self._print(line)

    def close(self) -> None:
        pass


class RichView(PlainView):
    """A terminal: output lines scroll above a live bar driven by rank 0's step records."""

    def __init__(self, console: Console) -> None:
        super().__init__(console.file)
        self.console = console
        self.progress = Progress(
            TextColumn("[bold]epoch {task.fields[epoch]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"),
            TextColumn("acc {task.fields[accuracy]}"),
            TextColumn("{task.fields[rate]} samples/s"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        self.task = self.progress.add_task("train", total=None, epoch="-", loss="-", accuracy="-", rate="-")
        self.progress.start()

    def _print(self, text: str) -> None:
        self.progress.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def record(self, record: dict[str, Any]) -> None:
        fields: dict[str, Any] = {"epoch": record.get("epoch", "-")}
        if record.get("loss") is not None:
            fields["loss"] = _num(record["loss"])
        if record.get("accuracy") is not None:
            fields["accuracy"] = _num(record["accuracy"])
        if record.get("samples_per_s") is not None:
            fields["rate"] = _num(record["samples_per_s"], ".0f")
        self.progress.update(self.task, completed=record.get("step") or 0, total=record.get("total_steps"), **fields)

    def end(self, result: RunResult) -> None:
        self.close()
        super().end(result)

    def close(self) -> None:
        self.progress.stop()


def make_view(out: IO[str], *, live: bool | None = None) -> PlainView:
    console = Console(file=out)
    if live if live is not None else console.is_terminal:
        return RichView(console)
    return PlainView(out)
