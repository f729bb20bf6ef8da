"""`python -m kubetrain.trainer {train,preflight} [--config FILE]` (under torchrun for several processes).

The configuration comes from `--config` (YAML or JSON, camelCase as in a TrainingJob) or
else from the KUBETRAIN_CONFIG env var the operator renders. Exit status 0 on success, 1
on any failure, 2 on a usage error; the error is logged on every rank that saw it.

On SIGTERM or SIGINT every rank stops at one optimizer-step boundary, rank 0 checkpoints that
step, and every rank exits with 143 (kubetrain.runtime.worker.stopping): a deleted, evicted, drained,
preempted or suspended pod loses no step.

The process ends with `os._exit` once the outcome is known and its output flushed: after
`finish` every rank has passed the last collective and rank 0's checkpoint and records are
durable, so destructors have nothing left to do but can still hang or abort. torch before
2.8 deadlocks in `~ProcessGroupGloo` (joining a gloo thread that waits for the GIL the
destructor holds, pytorch/pytorch#56297, fixed by #154976), and after a failure a destroy
waits for collectives in flight that no peer will finish. torchrun needs only the exit code.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence

from pydantic import ValidationError

from kubetrain.api.training import TrainConfig
from kubetrain.runtime.ending import leave
from kubetrain.trainer import faults


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m kubetrain.trainer", description=__doc__)
    parser.add_argument("command", choices=("train", "preflight"), help="train, or only check the collectives")
    parser.add_argument("--config", metavar="FILE", help="TrainConfig as YAML/JSON (default: $KUBETRAIN_CONFIG)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        config = TrainConfig.from_file(args.config) if args.config else TrainConfig.from_env()
        faults.from_env_checked()
    except (OSError, ValidationError, ValueError) as exc:
        print(f"kubetrain trainer: invalid configuration: {exc}", file=sys.stderr)
        return 2
    # Import torch only now: `--help` and config errors stay fast.
    from kubetrain.runtime.worker import dist as kdist
    from kubetrain.runtime.worker.metrics import MetricsLogger, configure_logging, log
    from kubetrain.runtime.worker.stopping import EXIT_STOPPED, Stopped
    from kubetrain.trainer.checkpoint import CheckpointError
    from kubetrain.trainer.preflight import PreflightError, run_preflight
    from kubetrain.trainer.train import train

    # Only for the log prefix: a malformed RANK is reported by setup() as a contract error.
    raw_rank = os.environ.get("RANK", "")
    rank = int(raw_rank) if raw_rank.isdigit() else 0
    configure_logging(rank)
    spec = config.training
    try:
        ctx = kdist.setup(
            config.backend,
            timeout_s=spec.process_group_timeout_seconds,
            connect_timeout_s=spec.connect_timeout_seconds,
        )
        if args.command == "preflight" or spec.preflight:
            metrics = MetricsLogger(ctx.rank, config.checkpoint.dir if args.command == "train" else None)
            try:
                result = run_preflight(ctx)
                metrics.emit("preflight", step=0, epoch=0, **result)
            finally:
                metrics.close()
        if args.command == "train":
            try:
                train(config, ctx)
            except Stopped as stopped:
                log.warning("%s; checkpoint of step %d written, exiting %d", stopped, stopped.step, EXIT_STOPPED)
                # Rank 0's checkpoint is durable once everyone passed this barrier.
                kdist.barrier(ctx)
                return EXIT_STOPPED
        kdist.finish(ctx, destroy=False)
        return 0
    except (kdist.ContractError, CheckpointError, PreflightError) as exc:
        log.error("%s", exc)
        record_error(exc)  # the failure's message in status: "cannot load ... checkpoint store s3://..."
        if rank == 0 and args.command == "preflight":
            # The operator reads the verdict from stdout like any other record.
            MetricsLogger(0, None).emit("preflight", step=0, epoch=0, ok=False, error=str(exc))
        return 1
    except Exception as exc:
        log.exception("training failed")
        record_error(exc)
        return 1


def record_error(exc: BaseException) -> None:
    """Under torchrun: the error file its agent reads for the failure's message (status.failures[]
    with an in-place restart, whose pods keep running and leave no termination message)."""
    if not os.environ.get("TORCHELASTIC_ERROR_FILE"):
        return
    with contextlib.suppress(Exception):
        from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

        ErrorHandler().record_exception(exc)


if __name__ == "__main__":
    leave(main())
