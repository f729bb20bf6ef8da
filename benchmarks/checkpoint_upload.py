"""The training stall per checkpoint save: an object store with the background upload, against a
synchronous save to the same server and against today's save to a volume, side by side.

    .venv/bin/python benchmarks/checkpoint_upload.py [--models digits,100m] [--saves 4] [--steps-between 30]

A real S3 server (SeaweedFS, tests/support/s3server.py) runs on 127.0.0.1 for the run. For each
model (the README's example, digits-cpu's MLP; and a ~100M-parameter MLP) with AdamW state, one
process trains on the CPU and saves every `--steps-between` steps, the three arms taking turns
save by save so that the machine's load falls on each alike:

- volume: today's `Checkpointer.save` into a directory (fsynced, atomic rename);
- sync: the object store, `save(wait=True)`: staged, uploaded and committed before training goes on;
- background: the object store, `save()`: a copy of the tensors in memory, then training goes on
  while a thread serialises it into the staging dir, uploads and commits it.

The stall is the wall time of the `save` call, as the training loop feels it. For the background
arm it includes waiting for the previous upload when saves come faster than uploads (reported
apart), and the steps trained while an upload thread is alive (alive at the step's end) are timed
against the volume arm's steps: what the upload takes from the steps beside it on a 2-core machine;
the steps after it ended are reported apart.

Results go to benchmarks/results/checkpoint_upload.json (or --output).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "benchmarks" / "results" / "checkpoint_upload.json"
sys.path[:0] = [str(ROOT / "tests")]

from ranks import machine  # noqa: E402
from support.s3server import S3Server  # noqa: E402

ARMS = ("volume", "sync", "background")
# (input features, hidden width, linear layers): digits-cpu's MLP (examples/digits-cpu.yaml: the trainer's
# own model, hiddenSize 128), and an MLP of ~100M parameters.
MODELS = {"digits": (64, 128, 3), "100m": (1024, 4000, 8)}


def build(name: str) -> tuple[Any, Any, int]:
    import torch
    from torch import nn

    features, hidden, layers = MODELS[name]
    torch.manual_seed(0)
    if name == "digits":
        from kubetrain.trainer.model import MLP

        mlp = MLP(features, hidden, 10)
        optimizer = torch.optim.AdamW(mlp.parameters(), lr=3e-3)
        return mlp, optimizer, sum(p.numel() for p in mlp.parameters())
    widths = [features] + [hidden] * (layers - 1) + [10]
    blocks: list[nn.Module] = []
    for i in range(len(widths) - 1):
        blocks += [nn.Linear(widths[i], widths[i + 1]), nn.ReLU()]
    model = nn.Sequential(*blocks[:-1])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return model, optimizer, sum(p.numel() for p in model.parameters())


def train_steps(
    model: Any, optimizer: Any, count: int, features: int, uploading: Any = None, batch: int = 16
) -> tuple[list[float], list[float]]:
    """`count` steps' times, split in two: (those that ended while `uploading()` said an upload
    thread was alive, the others). A step counts as during the upload when the thread is still
    alive at its end: all of it ran beside the upload."""
    import torch
    import torch.nn.functional as F

    during, after = [], []
    for _ in range(count):
        started = time.perf_counter()
        x, y = torch.randn(batch, features), torch.randint(0, 10, (batch,))
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        took = time.perf_counter() - started
        (during if uploading is not None and uploading() else after).append(took)
    return during, after


def measure(name: str, server: S3Server, saves: int, steps_between: int, workdir: Path) -> dict[str, Any]:
    from kubetrain.api.training import ObjectStoreConfig
    from kubetrain.trainer.checkpoint import Checkpointer

    features = MODELS[name][0]
    model, optimizer, params = build(name)
    train_steps(model, optimizer, 2, features)  # AdamW's state exists, and a warm-up
    checkpointers = {}
    for arm in ARMS:
        store = None
        if arm != "volume":
            bucket = f"bench-{name}-{arm}"
            server.create_bucket(bucket)
            store = ObjectStoreConfig(url=f"s3://{bucket}/run", endpoint=server.endpoint)
        checkpointers[arm] = Checkpointer(
            workdir / f"{name}-{arm}", rank=0, world_size=1, keep=1, object_store=store, job="bench", attempt=0
        )
        checkpointers[arm].load()  # registers the attempt, as a run's start does
    stalls: dict[str, list[float]] = {arm: [] for arm in ARMS}
    waited: list[float] = []
    steps_after: dict[str, list[float]] = {arm: [] for arm in ARMS}
    # The background arm's steps that ran while its upload thread was alive (the rest are in steps_after).
    steps_during: list[float] = []
    step = 0
    for _ in range(saves):
        for arm in ARMS:
            step += 1
            ckpt = checkpointers[arm]
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
            uploader = getattr(ckpt.storage, "uploader", None)  # the object store's; a volume has none
            if arm == "background" and uploader is not None and uploader.running() is not None:
                started = time.perf_counter()
                uploader.wait()
                waited.append(time.perf_counter() - started)
            started = time.perf_counter()
            ckpt.save(step, state, wait=arm == "sync")
            stalls[arm].append(time.perf_counter() - started + (waited[-1] if arm == "background" and waited else 0))
            uploading = (lambda u=uploader: u.running() is not None) if arm == "background" else None
            during, after = train_steps(model, optimizer, steps_between, features, uploading)
            steps_during += during
            steps_after[arm] += after
    for ckpt in checkpointers.values():
        ckpt.wait()
    size = sum(p.stat().st_size for p in (workdir / f"{name}-volume").glob("step-*/state.pt"))
    summary: dict[str, Any] = {"parameters": params, "checkpoint_bytes": size, "saves_per_arm": saves}
    for arm in ARMS:
        summary[arm] = {
            "stall_median_s": round(statistics.median(stalls[arm]), 4),
            "stall_max_s": round(max(stalls[arm]), 4),
            "stalls_s": [round(s, 4) for s in stalls[arm]],
            # None where every step after a save ran beside its upload (the background arm, at a few steps apart).
            "step_median_s_after_save": round(statistics.median(steps_after[arm]), 5) if steps_after[arm] else None,
        }
    # Each arm trains the same steps_between steps after each save: the volume arm's are steps with
    # nothing beside them; the background arm's split into those that ran beside its upload and after.
    summary["background"]["waited_for_previous_upload_s"] = [round(w, 4) for w in waited]
    sync, background = summary["sync"]["stall_median_s"], summary["background"]["stall_median_s"]
    summary["background_over_sync_stall"] = round(background / sync, 3) if sync else None
    volume_step = summary["volume"]["step_median_s_after_save"]
    summary["background"]["steps_during_upload"] = len(steps_during)
    summary["background"]["step_median_s_during_upload"] = (
        round(statistics.median(steps_during), 5) if steps_during else None
    )
    # What the upload takes from the steps that run beside it (None: every upload ended within a step).
    summary["step_slowdown_during_upload"] = (
        round(statistics.median(steps_during) / volume_step, 3) if steps_during else None
    )
    after = summary["background"]["step_median_s_after_save"]
    summary["step_slowdown_after_upload"] = round(after / volume_step, 3) if after is not None else None
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="digits,100m")
    parser.add_argument("--saves", type=int, default=4)
    parser.add_argument("--steps-between", type=int, default=30)
    parser.add_argument("--output", type=Path, default=RESULT)
    args = parser.parse_args()
    result: dict[str, Any] = {"models": {}}
    with tempfile.TemporaryDirectory(prefix="kubetrain-ckpt-bench-") as tmp, S3Server() as server:
        os.environ.update(server.env())  # the credentials, as a pod's env has them
        for name in args.models.split(","):
            result["models"][name] = measure(name, server, args.saves, args.steps_between, Path(tmp))
            print(json.dumps({name: result["models"][name]}, indent=1), file=sys.stderr)
    big = result["models"].get("100m")
    result["targets"] = {
        # The point of the background upload: the save costs training about what the local write costs.
        "100m_background_stall_at_most_half_the_sync_stall": None
        if big is None
        else big["background_over_sync_stall"] <= 0.5,
    }
    result["machine"] = machine()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["targets"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
