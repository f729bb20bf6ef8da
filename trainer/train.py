"""The built-in training loop: load -> (resume) -> steps -> eval/checkpoint -> done.

Per-step cost over a hand-written DDP loop is kept to nothing measurable: the loss stays on
the device and is summed across ranks only on log steps (one all_reduce that also carries
rank 0's time-based save decision), and no `.item()` runs on other steps.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from kubetrain.api.training import TrainConfig, TrainingSpec
from kubetrain.trainer.checkpoint import Checkpointer
from kubetrain.trainer.data import eval_loader, load_splits, sharded_loader
from kubetrain.trainer.dist import DistContext
from kubetrain.trainer.metrics import MetricsLogger, log
from kubetrain.trainer.model import build_model

Batch = tuple[torch.Tensor, torch.Tensor]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def autocast_context(device: torch.device, bf16: bool) -> contextlib.AbstractContextManager[Any]:
    if bf16 and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def accumulate_gradients(
    model: nn.Module,
    micro_batches: Iterator[Batch],
    count: int,
    *,
    loss_fn: LossFn = F.cross_entropy,
    device: torch.device | None = None,
    bf16: bool = False,
) -> torch.Tensor:
    """Forward and backward `count` micro-batches; gradients all-reduce only on the last one.

    Each loss is divided by `count`, so the gradients equal those of one step on the
    concatenated batch. For a DDP model every micro-batch but the last runs forward *and*
    backward inside `no_sync()`: DDP decides in the forward whether the backward syncs.
    Returns the summed (already divided) loss as a device tensor, without a host sync.
    """
    device = device or next(model.parameters()).device
    total = torch.zeros((), device=device)
    for index in range(count):
        x, y = next(micro_batches)
        x = x.to(device, non_blocking=True)
        y = y.to(device, non_blocking=True)
        last = index == count - 1
        sync = contextlib.nullcontext() if last or not isinstance(model, DDP) else model.no_sync()
        with sync:
            with autocast_context(device, bf16):
                loss = loss_fn(model(x), y) / count
            loss.backward()  # type: ignore[no-untyped-call]
        total += loss.detach().float()
    return total


@torch.no_grad()
def evaluate(model: nn.Module, loader: Any, device: torch.device, *, bf16: bool = False) -> tuple[float, float]:
    """(accuracy, mean loss) over the whole test set, each rank scoring its own disjoint shard."""
    was_training = model.training
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=device)  # correct, count, loss sum
    for x, y in loader:
        x = x.to(device, non_blocking=True)
        y = y.to(device, non_blocking=True)
        with autocast_context(device, bf16):
            logits = model(x)
        sums[0] += (logits.argmax(dim=1) == y).sum()
        sums[1] += y.numel()
        sums[2] += F.cross_entropy(logits.float(), y, reduction="sum")
    if dist.is_initialized():
        dist.all_reduce(sums)
    model.train(was_training)
    correct, count, loss_sum = sums.tolist()
    return correct / max(count, 1), loss_sum / max(count, 1)


def cosine_schedule(total_steps: int) -> Callable[[int], float]:
    def factor(step: int) -> float:
        return 0.5 * (1.0 + math.cos(math.pi * min(step, total_steps) / total_steps))

    return factor


def build_optimizer(spec: TrainingSpec, params: Any) -> torch.optim.Optimizer:
    if spec.optimizer == "sgd":
        return torch.optim.SGD(params, lr=spec.learning_rate, momentum=0.9, weight_decay=spec.weight_decay)
    return torch.optim.AdamW(params, lr=spec.learning_rate, weight_decay=spec.weight_decay)


def train(config: TrainConfig, ctx: DistContext) -> dict[str, Any]:
    """Train under an initialised process group; returns rank 0's final `done` fields."""
    spec, ckpt_cfg = config.training, config.checkpoint
    device = ctx.device
    if spec.bf16 and device.type != "cuda":
        log.warning("bf16 autocast needs a GPU; training in float32")

    splits = load_splits(spec)
    pin = device.type == "cuda"
    loader = sharded_loader(
        splits.train,
        batch_size=spec.batch_size,
        rank=ctx.rank,
        world_size=ctx.world_size,
        seed=spec.seed,
        drop_last=spec.drop_last,
        num_workers=spec.num_workers,
        pin_memory=pin,
    )
    test_loader = eval_loader(
        splits.test, batch_size=max(spec.batch_size, 256), rank=ctx.rank, world_size=ctx.world_size, pin_memory=pin
    )
    accum = spec.grad_accum_steps
    steps_per_epoch = len(loader) // accum
    if steps_per_epoch == 0:
        raise ValueError(
            f"each rank's shard has {len(loader)} batches of {spec.batch_size}, fewer than gradAccumSteps={accum}: "
            "lower batchSize or gradAccumSteps, or use more data"
        )
    total_steps = spec.epochs * steps_per_epoch
    if spec.max_steps is not None:
        total_steps = min(total_steps, spec.max_steps)

    # Identical initial weights on every rank; then a per-rank stream for dropout.
    torch.manual_seed(spec.seed)
    module = build_model(spec, splits.input_shape, splits.num_classes).to(device)
    torch.manual_seed(spec.seed + 1 + ctx.rank)
    model = DDP(
        module,
        device_ids=[ctx.local_rank] if device.type == "cuda" else None,
        gradient_as_bucket_view=True,
    )
    optimizer = build_optimizer(spec, model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, cosine_schedule(total_steps) if spec.lr_schedule == "cosine" else (lambda _: 1.0)
    )
    fingerprint = config.fingerprint()
    checkpointer = Checkpointer(
        ckpt_cfg.dir,
        rank=ctx.rank,
        world_size=ctx.world_size,
        keep=ckpt_cfg.keep,
        fingerprint=fingerprint,
        generators=[loader.generator],
    )
    metrics = MetricsLogger(ctx.rank, ckpt_cfg.dir, total_steps=total_steps)
    try:
        return _loop(
            spec, ckpt_cfg, ctx, model, module, optimizer, scheduler, loader, test_loader, checkpointer, metrics,
            steps_per_epoch, total_steps, fingerprint,
        )  # fmt: skip
    finally:
        metrics.close()


def _loop(
    spec: TrainingSpec,
    ckpt_cfg: Any,
    ctx: DistContext,
    model: DDP,
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    loader: Any,
    test_loader: Any,
    checkpointer: Checkpointer,
    metrics: MetricsLogger,
    steps_per_epoch: int,
    total_steps: int,
    fingerprint: str,
) -> dict[str, Any]:
    device, accum, world = ctx.device, spec.grad_accum_steps, ctx.world_size
    step = epoch = batch = 0  # optimizer steps done; current epoch; micro-batches done in it
    loaded = checkpointer.load()
    if loaded is not None:
        _, state = loaded
        module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        step, epoch, batch = state["step"], state["epoch"], state["batch_in_epoch"]
    resumed_from = str(loaded[0]) if loaded else None
    metrics.emit("start", step=step, epoch=epoch, world_size=world, backend=ctx.backend, resumed_from=resumed_from)
    if loaded is not None:
        metrics.emit("resume", step=step, epoch=epoch, path=resumed_from)

    last_saved = step if loaded is not None else -1
    last_save_time = time.monotonic()
    last_loss: float | None = None
    accuracy: float | None = None

    def save() -> None:
        nonlocal last_saved, last_save_time
        state = {
            "model": module.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "step": step,
            "epoch": epoch,
            "batch_in_epoch": batch,
            "fingerprint": fingerprint,
        }
        path = checkpointer.save(step, state)
        last_saved, last_save_time = step, time.monotonic()
        if path is not None:
            metrics.emit("checkpoint", step=step, epoch=epoch, path=str(path))

    loss_sum = torch.zeros((), device=device)
    window_steps = 0
    window_start = time.perf_counter()
    batches_per_epoch = steps_per_epoch * accum
    samples_per_step = spec.batch_size * accum * world
    while epoch < spec.epochs and step < total_steps:
        micro = loader.epoch(epoch, skip_batches=batch)
        while batch < batches_per_epoch and step < total_steps:
            loss_sum += accumulate_gradients(model, micro, accum, device=device, bf16=spec.bf16)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            batch += accum
            window_steps += 1
            time_save = False
            if step % spec.log_every_steps == 0 or step == total_steps:
                # One collective per log window: the loss sum, plus rank 0's "time to save".
                due = ctx.rank == 0 and ckpt_cfg.every_seconds is not None
                due = due and time.monotonic() - last_save_time >= ckpt_cfg.every_seconds
                packed = torch.stack([loss_sum, torch.tensor(float(due), device=device)])
                dist.all_reduce(packed)
                summed, flag = packed.tolist()
                elapsed = time.perf_counter() - window_start
                last_loss = summed / world / window_steps
                metrics.emit(
                    "step",
                    step=step,
                    epoch=epoch,
                    loss=last_loss,
                    lr=scheduler.get_last_lr()[0],
                    samples_per_s=window_steps * samples_per_step / elapsed,
                    step_time_s=elapsed / window_steps,
                )
                time_save = flag > 0
                loss_sum.zero_()
                window_steps = 0
                window_start = time.perf_counter()
            every = ckpt_cfg.every_steps
            # The epoch-end save covers a save due on an epoch's last step.
            if batch < batches_per_epoch and ((every is not None and step % every == 0) or time_save):
                paused = time.perf_counter()
                save()
                window_start += time.perf_counter() - paused
        del micro
        if batch < batches_per_epoch:
            break  # maxSteps reached inside the epoch
        paused = time.perf_counter()
        accuracy, eval_loss = evaluate(module, test_loader, device, bf16=spec.bf16)
        metrics.emit("eval", step=step, epoch=epoch, accuracy=accuracy, eval_loss=eval_loss)
        epoch, batch = epoch + 1, 0
        save()
        window_start += time.perf_counter() - paused
    if last_saved != step:
        save()
    if accuracy is None or batch != 0:
        accuracy, eval_loss = evaluate(module, test_loader, device, bf16=spec.bf16)
        metrics.emit("eval", step=step, epoch=epoch, accuracy=accuracy, eval_loss=eval_loss)
    done = {"loss": last_loss, "accuracy": accuracy}
    metrics.emit("done", step=step, epoch=epoch, **done)
    return {"step": step, "epoch": epoch, "total_steps": total_steps, **done}
