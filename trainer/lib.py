"""The library API for bring-your-own training scripts: the trainer's parts, nothing more.

    from kubetrain.trainer import lib

    with lib.distributed() as ctx:                      # env contract -> process group
        loader = lib.sharded_loader(dataset, batch_size=32, rank=ctx.rank, world_size=ctx.world_size)
        model = lib.DDP(net.to(ctx.device))
        ckpt = lib.checkpointer("/tmp/ckpt", ctx, generators=[loader.generator], every_steps=100)
        resumed = ckpt.load()                           # (where, state) or None; RNG restored per rank
        ...
        if ckpt.due(step):
            ckpt.save(step, {"model": model.module.state_dict(), "step": step}, epoch=epoch)
        lib.log0(ctx, "step", step=step, epoch=epoch, loss=loss)
        if stop.agreed():                               # SIGTERM on any rank (pod deleted, evicted, ...)
            ckpt.save(step, {...}, reason="signal")     # this step, committed before it returns: no step lost
            stop.exit()                                 # every rank exits EXIT_STOPPED (143)
        ...
        ckpt.wait()                                     # before `done`: the last upload committed

`lib.checkpointer` saves where the TrainingJob says (`checkpoint.dir`, or `checkpoint.objectStore`
staged in it; `default` outside a job) and logs the `checkpoint` records itself, once each is
committed. `lib.Checkpointer(directory, ..., object_store="s3://bucket/prefix")` is the same by hand.

with `stop = lib.StopSignal(ctx)` made once, on every rank, before the loop (kubetrain.runtime.worker.stopping).
A DataLoader of your own with `num_workers > 0` needs `worker_init_fn=lib.loader_worker_init`
(`lib.sharded_loader` has it): else the stop signal kills its workers before the rank can save.
`watchdog = lib.HangWatchdog(ctx.local_rank)` and `watchdog.beat()` once per step give a Stalled
restart every rank's stacks to name the rank that hung (kubetrain.runtime.worker.watchdog).

A training that keeps its global batch at any world size, resumes a checkpoint at another one,
and loses no step when a peer dies (the built-in trainer's data contract, kubetrain.trainer.cursor):

    loader = lib.CursorLoader(train_set, global_batch=96, micro_batch=32, rank=ctx.rank, world_size=ctx.world_size)
    ckpt = lib.checkpointer("/tmp/ckpt", ctx, resizable=True)   # the state below holds at any size
    survivor = lib.Survivor(ctx.rank, ctx.agent_store)
    try:
        for step_data in loader.steps(epoch, cursor):             # (epoch, cursor) from the checkpoint
            loss = lib.accumulate_gradients(model, iter(step_data.micro), len(step_data.micro),
                                            weights=step_data.weights)
            optimizer.step(); optimizer.zero_grad(); step += 1; cursor = step_data.cursor
            survivor.arm()                                        # the agents let a survivor save
            ...
    except Exception as error:                                    # a peer died: the lowest survivor
        survivor.save(error, ckpt, step, {"model": ..., "epoch": epoch, "cursor": cursor, "step": step})
        raise

`lib.context()` returns the same `ctx` anywhere inside the block, and the context of a group the
script initialised itself (`dist.init_process_group`). A function run by kubetrain.client's
`train()` starts with `ctx = lib.context()`, which sets its group up on first use (the job's
backend and timeouts), or initialises the group itself, as a function written for Kubeflow does.

Every function here is collective where it says so and safe to call on every rank otherwise.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torch.nn.parallel import DistributedDataParallel as DDP

from kubetrain.api.training import CONFIG_ENV, ObjectStoreConfig, TrainConfig
from kubetrain.runtime.worker.dist import ContractError, DistContext, barrier, distributed, finish, setup, teardown
from kubetrain.runtime.worker.dist import current as context
from kubetrain.runtime.worker.metrics import MetricsLogger, configure_logging
from kubetrain.runtime.worker.stopping import EXIT_STOPPED, StopSignal, loader_worker_init
from kubetrain.runtime.worker.survivor import Survivor
from kubetrain.runtime.worker.watchdog import HangWatchdog
from kubetrain.trainer.checkpoint import Checkpointer, CheckpointError, latest_checkpoint
from kubetrain.trainer.cursor import CursorLoader, GlobalBatches, Step
from kubetrain.trainer.data import ShardedLoader, eval_loader, sharded_loader
from kubetrain.trainer.train import accumulate_gradients, evaluate

__all__ = [
    "DDP",
    "EXIT_STOPPED",
    "CheckpointError",
    "Checkpointer",
    "ContractError",
    "CursorLoader",
    "DistContext",
    "GlobalBatches",
    "HangWatchdog",
    "MetricsLogger",
    "ShardedLoader",
    "Step",
    "StopSignal",
    "Survivor",
    "accumulate_gradients",
    "barrier",
    "checkpoint_dir",
    "checkpointer",
    "configure_logging",
    "context",
    "distributed",
    "eval_loader",
    "evaluate",
    "finish",
    "latest_checkpoint",
    "loader_worker_init",
    "log0",
    "object_store",
    "setup",
    "sharded_loader",
    "teardown",
]

_loggers: dict[str, MetricsLogger] = {}


def checkpoint_dir(default: str | Path) -> Path:
    """The TrainingJob's `checkpoint.dir` when KUBETRAIN_CONFIG is set, else `default`."""
    if os.environ.get(CONFIG_ENV):
        return Path(TrainConfig.from_env().checkpoint.dir)
    return Path(default)


def object_store() -> ObjectStoreConfig | None:
    """The TrainingJob's `checkpoint.objectStore` when KUBETRAIN_CONFIG is set, else None."""
    if os.environ.get(CONFIG_ENV):
        return TrainConfig.from_env().checkpoint.object_store
    return None


def checkpointer(default: str | Path, ctx: DistContext, **kwargs: Any) -> Checkpointer:
    """A Checkpointer on the job's checkpoint location: `checkpoint.dir`, or `checkpoint.objectStore`
    staged in it (`default` outside a TrainingJob), keeping `checkpoint.keep` unless `keep=` is
    given. It logs a `checkpoint` record (into `<dir>/metrics.jsonl` too, as `log0(...,
    directory=<dir>)` does) once each checkpoint is committed. Other arguments: Checkpointer's."""
    job = TrainConfig.from_env().checkpoint if os.environ.get(CONFIG_ENV) else None
    directory = Path(job.dir) if job is not None else Path(default)
    if job is not None:
        kwargs.setdefault("keep", job.keep)
    return Checkpointer(
        directory,
        rank=ctx.rank,
        world_size=ctx.world_size,
        object_store=job.object_store if job is not None else None,
        metrics=_logger(ctx, directory),
        **kwargs,
    )


def _logger(ctx: DistContext, directory: str | Path | None) -> MetricsLogger:
    key = str(directory)
    logger = _loggers.get(key)
    if logger is None:
        logger = _loggers[key] = MetricsLogger(ctx.rank, directory)
    return logger


def log0(
    ctx: DistContext,
    event: str,
    *,
    step: int,
    epoch: int,
    total_steps: int | None = None,
    directory: str | Path | None = None,
    **fields: Any,
) -> None:
    """Emit one metrics record (the built-in trainer's format) from rank 0; a no-op elsewhere.

    With `directory`, records are also appended to `<directory>/metrics.jsonl`. `total_steps`
    is remembered for the following records of the same directory.
    """
    logger = _logger(ctx, directory)
    if total_steps is not None:
        logger.total_steps = total_steps
    logger.emit(event, step=step, epoch=epoch, **fields)
