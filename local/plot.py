"""Loss and accuracy curves of a run, from rank 0's metrics.jsonl, as a PNG.

matplotlib comes with the `trainer` extra and is imported only when a plot is drawn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubetrain.api.records import METRICS_FILE, records_in

PLOT_FILE = "metrics.png"


@dataclass
class Curves:
    steps: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    eval_steps: list[int] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)
    eval_loss: list[float] = field(default_factory=list)
    restarts_at: list[int] = field(default_factory=list)


def metrics_path(run: Path) -> Path:
    """A run dir's metrics file (in its checkpoints/), or the file itself."""
    if run.is_file():
        return run
    for candidate in (run / "checkpoints" / METRICS_FILE, run / METRICS_FILE):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"{run}: no {METRICS_FILE} (looked in {run}/checkpoints and {run})")


def curves(records: list[dict[str, Any]]) -> Curves:
    """One value per step: after a gang restart the steps since the checkpoint are trained again,
    and the later attempt's value is the one that counts."""
    loss: dict[int, float] = {}
    evals: dict[int, tuple[float, float | None]] = {}
    out = Curves()
    for record in records:
        step = record.get("step")
        if step is None:
            continue
        event = record["event"]
        if event == "step" and record.get("loss") is not None:
            loss[int(step)] = float(record["loss"])
        elif event == "eval" and record.get("accuracy") is not None:
            eval_loss = record.get("eval_loss")
            evals[int(step)] = (float(record["accuracy"]), None if eval_loss is None else float(eval_loss))
        elif event == "resume":
            out.restarts_at.append(int(step))
    out.steps = sorted(loss)
    out.loss = [loss[s] for s in out.steps]
    out.eval_steps = sorted(evals)
    out.accuracy = [evals[s][0] for s in out.eval_steps]
    out.eval_loss = [v if (v := evals[s][1]) is not None else float("nan") for s in out.eval_steps]
    return out


def plot_run(run: Path, out: Path | None = None) -> Path:
    """Write the loss/accuracy PNG of a run dir (or metrics file); returns its path."""
    source = metrics_path(run)
    data = curves(records_in(source.read_text()))
    if not data.steps and not data.eval_steps:
        raise ValueError(f"{source}: no step or eval records to plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = out or (run if run.is_dir() else source.parent) / PLOT_FILE
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    ax_loss.plot(data.steps, data.loss, label="train loss (mean over ranks)")
    if data.eval_steps:
        ax_loss.plot(data.eval_steps, data.eval_loss, "o-", label="eval loss")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("loss")
    ax_loss.legend()
    ax_acc.plot(data.eval_steps, data.accuracy, "o-", color="tab:green")
    ax_acc.set_xlabel("step")
    ax_acc.set_ylabel("eval accuracy")
    ax_acc.set_ylim(0, 1.02)
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        for step in data.restarts_at:
            ax.axvline(step, color="tab:red", linestyle=":", alpha=0.7)
    fig.suptitle(f"{run.name}" + (f" (resumed at steps {data.restarts_at})" if data.restarts_at else ""))
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
