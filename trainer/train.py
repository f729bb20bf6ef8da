"""The built-in training loop: build -> load -> loop(step, log if due, save if due) -> evaluate -> done.

Each step trains the next global batch of the epoch's seeded order (kubetrain.trainer.cursor):
where the run is, is (epoch, cursor), and with `globalBatchSize` a checkpoint resumes at any
world size. Dropout draws from a stream seeded by (seed, step, rank) at every step, so a resume
needs no RNG state, and a survivor can save alone when a peer dies (kubetrain.runtime.worker.survivor).

Per-step cost over a hand-written DDP loop is kept to nothing measurable: the loss stays on
the device and is summed across ranks only on log steps (one all_reduce that also carries
rank 0's time-based save vote), and no `.item()` runs on other steps.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from kubetrain.api.training import TrainConfig, TrainingSpec
from kubetrain.runtime.worker import survivor
from kubetrain.runtime.worker.dist import DistContext
from kubetrain.runtime.worker.metrics import MetricsLogger, log
from kubetrain.runtime.worker.stopping import Stopped, StopSignal, loader_worker_init
from kubetrain.runtime.worker.watchdog import HangWatchdog
from kubetrain.trainer.checkpoint import Checkpointer, CheckpointError
from kubetrain.trainer.cursor import CursorLoader, Step
from kubetrain.trainer.data import eval_loader, load_splits
from kubetrain.trainer.faults import FaultPoint
from kubetrain.trainer.ledger import Indexed, SampleLedger
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
    weights: list[float] | None = None,
) -> torch.Tensor:
    """Forward and backward `count` micro-batches; gradients all-reduce only on the last one.

    Each (mean) loss is multiplied by its weight, 1/count by default: the gradients then equal
    those of one step on the concatenated batch. With micro-batches of different sizes, weigh each
    by its share of the step (kubetrain.trainer.cursor.weight). For a DDP model every micro-batch
    but the last runs forward *and* backward inside `no_sync()`: DDP decides in the forward
    whether the backward syncs. An empty micro-batch adds no gradient but still syncs when last.
    Returns the summed (weighted) loss as a device tensor, without a host sync.
    """
    device = device or next(model.parameters()).device
    weights = weights if weights is not None else [1.0 / count] * count
    total = torch.zeros((), device=device)
    for index in range(count):
        x, y, *_ = next(micro_batches)
        x = x.to(device, non_blocking=True)
        y = y.to(device, non_blocking=True)
        last = index == count - 1
        sync = contextlib.nullcontext() if last or not isinstance(model, DDP) else model.no_sync()
        with sync:
            with autocast_context(device, bf16):
                out = model(x)
                # A rank with no sample this step (an epoch's tail shorter than the world) still
                # takes part in the gradient all-reduce, with zeros.
                loss = loss_fn(out, y) * weights[index] if len(y) else out.sum() * 0.0
            loss.backward()
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


@dataclass
class TrainState:
    """Where the run is; saved in every checkpoint (as top-level keys) and restored on resume."""

    step: int = 0  # optimizer steps done
    epoch: int = 0  # the epoch being trained
    cursor: int = 0  # samples of this epoch's order already trained, by all ranks together

    def state_dict(self) -> dict[str, int]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "cursor" not in state:
            raise CheckpointError(
                "the checkpoint was written by an older trainer (its data position is per rank): resume it "
                "with the image that wrote it, or start a new checkpoint dir"
            )
        self.step, self.epoch, self.cursor = state["step"], state["epoch"], state["cursor"]


class LogWindow:
    """Loss and throughput since the last log record; `paused()` keeps saves and evals out of it."""

    def __init__(self, device: torch.device, world_size: int, samples_per_step: int) -> None:
        self.world_size = world_size
        self.samples_per_step = samples_per_step
        self.loss_sum = torch.zeros((), device=device)
        self.steps = 0
        self.start = time.perf_counter()
        self.last_loss: float | None = None
        self.records = 0  # step records logged by this run

    def add(self, loss: torch.Tensor) -> None:
        self.loss_sum += loss
        self.steps += 1

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        paused_at = time.perf_counter()
        try:
            yield
        finally:
            self.start += time.perf_counter() - paused_at

    def close(self, vote: bool) -> tuple[dict[str, float], bool]:
        """One all_reduce of the loss sum and rank 0's vote: (step-record fields, agreed vote); then reset."""
        packed = torch.stack([self.loss_sum, torch.tensor(float(vote), device=self.loss_sum.device)])
        dist.all_reduce(packed)
        summed, votes = packed.tolist()
        elapsed = time.perf_counter() - self.start
        self.last_loss = summed / self.world_size / self.steps
        fields = {
            "loss": self.last_loss,
            "samples_per_s": self.steps * self.samples_per_step / elapsed,
            "step_time_s": elapsed / self.steps,
        }
        self.loss_sum.zero_()
        self.steps = 0
        self.start = time.perf_counter()
        self.records += 1
        return fields, votes > 0


@dataclass
class Run:
    """What `build` makes of a configuration; the loop's functions take it instead of a dozen parameters."""

    spec: TrainingSpec
    ctx: DistContext
    module: nn.Module  # the bare model: what is saved, loaded and evaluated
    model: DDP
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    loader: CursorLoader  # this rank's part of each global batch, step by step, from a position
    test_loader: Any
    checkpointer: Checkpointer
    metrics: MetricsLogger
    fingerprint: str
    total_steps: int
    fault: FaultPoint  # KUBETRAIN_FAULT (drills and tests); inert without it
    stop: StopSignal  # SIGTERM/SIGINT: every rank stops at one step boundary, checkpointed
    watchdog: HangWatchdog  # with hangTimeoutSeconds: stacks to the log when steps stop
    survivor: survivor.Survivor  # when a peer dies: the lowest survivor saves the last step
    ledger: SampleLedger | None  # KUBETRAIN_SAMPLE_LEDGER: every step's sample indices (tests)

    def state_dict(self, state: TrainState) -> dict[str, Any]:
        return {
            "model": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "fingerprint": self.fingerprint,
            **state.state_dict(),
        }

    def load_state_dict(self, saved: dict[str, Any]) -> TrainState:
        self.module.load_state_dict(saved["model"])
        self.optimizer.load_state_dict(saved["optimizer"])
        self.scheduler.load_state_dict(saved["scheduler"])
        state = TrainState()
        state.load_state_dict(saved)
        return state


def global_batch(spec: TrainingSpec, world_size: int) -> int:
    """Samples per optimizer step: `globalBatchSize`, else batchSize x gradAccumSteps x world size."""
    if spec.global_batch_size is not None:
        return spec.global_batch_size
    return spec.batch_size * spec.grad_accum_steps * world_size


def build(config: TrainConfig, ctx: DistContext) -> Run:
    """Data, model, optimizer, schedule, checkpointer and metrics of one run (nothing loaded yet)."""
    spec, ckpt, device = config.training, config.checkpoint, ctx.device
    if spec.bf16 and device.type != "cuda":
        log.warning("bf16 autocast needs a GPU; training in float32")
    splits = load_splits(spec)
    rank, world, pin = ctx.rank, ctx.world_size, device.type == "cuda"
    ledger = SampleLedger.from_env(rank, world)
    loader = CursorLoader(
        Indexed(splits.train) if ledger is not None else splits.train,
        global_batch=global_batch(spec, world),
        micro_batch=spec.batch_size,
        rank=rank,
        world_size=world,
        seed=spec.seed,
        drop_last=spec.drop_last,
        num_workers=spec.num_workers,
        pin_memory=pin,
        generator=torch.Generator().manual_seed(spec.seed + rank),
        worker_init_fn=loader_worker_init,  # a stop signal leaves the batches coming until the rank saves
    )
    eval_batch = max(spec.batch_size, 256)
    test_loader = eval_loader(splits.test, batch_size=eval_batch, rank=rank, world_size=world, pin_memory=pin)
    total_steps = spec.epochs * loader.steps_per_epoch
    total_steps = total_steps if spec.max_steps is None else min(total_steps, spec.max_steps)
    torch.manual_seed(spec.seed)  # identical initial weights on every rank
    module = build_model(spec, splits.input_shape, splits.num_classes).to(device)
    model = DDP(module, device_ids=[ctx.local_rank] if device.type == "cuda" else None, gradient_as_bucket_view=True)
    optimizer = build_optimizer(spec, model.parameters())
    schedule = cosine_schedule(total_steps) if spec.lr_schedule == "cosine" else (lambda _: 1.0)
    fingerprint = config.fingerprint()
    metrics = MetricsLogger(rank, ckpt.dir, total_steps=total_steps)
    checkpointer = Checkpointer(
        ckpt.dir,
        rank=rank,
        world_size=world,
        keep=ckpt.keep,
        fingerprint=fingerprint,
        every_steps=ckpt.every_steps,
        every_seconds=ckpt.every_seconds,
        object_store=ckpt.object_store,
        metrics=metrics,
        resizable=spec.global_batch_size is not None,
    )
    return Run(
        spec=spec,
        ctx=ctx,
        module=module,
        model=model,
        optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, schedule),
        loader=loader,
        test_loader=test_loader,
        checkpointer=checkpointer,
        metrics=metrics,
        fingerprint=fingerprint,
        total_steps=total_steps,
        fault=FaultPoint.from_env(rank, ckpt.dir),
        stop=StopSignal(ctx),
        watchdog=HangWatchdog(ctx.local_rank),
        survivor=survivor.Survivor(rank, ctx.agent_store),
        ledger=ledger,
    )


def load(run: Run) -> TrainState:
    """The newest complete checkpoint's state (every rank's RNG restored with it), or a fresh one."""
    loaded = run.checkpointer.load()
    state = run.load_state_dict(loaded[1]) if loaded is not None else TrainState()
    resumed_from = str(loaded[0]) if loaded is not None else None
    world, backend = run.ctx.world_size, run.ctx.backend
    fields = {"world_size": world, "backend": backend, "resumed_from": resumed_from}
    fields["global_batch"] = run.loader.batches.global_batch
    run.metrics.emit("start", step=state.step, epoch=state.epoch, **fields)
    if resumed_from is not None:
        reason = run.checkpointer.loaded_reason
        run.metrics.emit("resume", step=state.step, epoch=state.epoch, path=resumed_from, reason=reason)
    return state


def save(run: Run, state: TrainState, reason: str) -> None:
    """Collective: rank 0 writes the checkpoint; `reason` (periodic, epoch, final, signal) goes
    into its meta.json and its record (the checkpointer's, once committed), and from there into
    status.lastCheckpoint. A stop or final save returns only once committed (an object store's
    upload included): the process may exit right after it."""
    run.checkpointer.save(state.step, run.state_dict(state), reason=reason, epoch=state.epoch)


def evaluate_and_log(run: Run, state: TrainState) -> float:
    accuracy, eval_loss = evaluate(run.module, run.test_loader, run.ctx.device, bf16=run.spec.bf16)
    run.metrics.emit("eval", step=state.step, epoch=state.epoch, accuracy=accuracy, eval_loss=eval_loss)
    return accuracy


def step_seed(seed: int, step: int, rank: int) -> int:
    """The seed of a rank's dropout stream for one step: a resume needs no RNG state, and no
    rank's stream depends on another's (a survivor saves without its peers')."""
    return (seed * 1_000_003 + step) * 4099 + rank


def train_step(run: Run, step: Step, state: TrainState) -> torch.Tensor:
    """One optimizer step over this rank's part of the next global batch; returns the loss as a
    device tensor (this rank's share of the step's mean loss, times the world size)."""
    torch.manual_seed(step_seed(run.spec.seed, state.step, run.ctx.rank))
    micro = step.micro
    loss = accumulate_gradients(
        run.model, iter(micro), len(micro), device=run.ctx.device, bf16=run.spec.bf16, weights=step.weights
    )
    run.optimizer.step()
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    state.step += 1
    if run.ledger is not None:
        run.ledger.write(state, micro)
    state.cursor = step.cursor
    return loss


def log_if_due(run: Run, state: TrainState, window: LogWindow) -> bool:
    """On log steps: the window's one collective and a step record. Returns the agreed time vote.
    The first step of every run is logged too: it ends the attempt's start-up (its timeline)."""
    due = state.step % run.spec.log_every_steps == 0 or state.step == run.total_steps
    if not due and window.records > 0:
        return False
    fields, time_vote = window.close(run.checkpointer.time_vote())
    run.metrics.emit("step", step=state.step, epoch=state.epoch, lr=run.scheduler.get_last_lr()[0], **fields)
    return time_vote


def train_epoch(run: Run, state: TrainState, window: LogWindow) -> bool:
    """Train the current epoch on from `state.cursor`; False when maxSteps ended it early."""
    epoch_samples = run.loader.batches.epoch_samples
    steps = run.loader.steps(state.epoch, state.cursor)
    while state.cursor < epoch_samples and state.step < run.total_steps:
        window.add(train_step(run, next(steps), state))
        run.survivor.arm()
        run.watchdog.beat()
        run.fault.reached(state.step)
        time_vote = log_if_due(run, state, window)
        if run.stop.agreed():
            with window.paused():
                save(run, state, "signal")
            raise Stopped(state.step, run.stop.received)
        # The epoch-end save covers a save due on an epoch's last step.
        if state.cursor < epoch_samples and run.checkpointer.due(state.step, time_vote=time_vote):
            with window.paused():
                save(run, state, "periodic")
    return state.cursor >= epoch_samples


def loop(run: Run, state: TrainState, window: LogWindow) -> float | None:
    """Epochs until the last one or maxSteps; each finished epoch is evaluated and saved. Returns the last accuracy."""
    accuracy = None
    while state.epoch < run.spec.epochs and state.step < run.total_steps:
        if not train_epoch(run, state, window):
            break
        with window.paused():
            accuracy = evaluate_and_log(run, state)
            state.epoch, state.cursor = state.epoch + 1, 0
            save(run, state, "epoch")
    return accuracy


def train(config: TrainConfig, ctx: DistContext) -> dict[str, Any]:
    """Train under an initialised process group; returns rank 0's final `done` fields."""
    run = build(config, ctx)
    try:
        state = load(run)
        window = LogWindow(ctx.device, ctx.world_size, run.loader.batches.global_batch)
        try:
            accuracy = loop(run, state, window)
        except Exception as error:  # a peer died: the elected survivor saves the step the gang reached
            run.survivor.save(error, run.checkpointer, state.step, run.state_dict(state))
            raise
        run.watchdog.stop()
        run.stop.close()
        if run.checkpointer.last_step != state.step:
            save(run, state, "final")
        run.checkpointer.wait()  # an epoch save's upload still in flight
        if accuracy is None or state.cursor != 0:
            accuracy = evaluate_and_log(run, state)
        done = {"loss": window.last_loss, "accuracy": accuracy}
        run.metrics.emit("done", step=state.step, epoch=state.epoch, **done)
        return {"step": state.step, "epoch": state.epoch, "total_steps": run.total_steps, **done}
    finally:
        run.metrics.close()
