"""`torchrun -m kubetrain.runtime.guest.function DIR`: call a function shipped by kubetrain.client's `train()`.

DIR holds the shipped module and the call (`kubetrain.api.function_call`). Every rank loads the
module and calls the function with the call's arguments. The return value is not sent anywhere:
print or `lib.log0` what you want to keep.

The process group is the function's, or made for it on first use. A function written as
Kubeflow's SDK documents it initialises the group itself (`dist.init_process_group(backend=...)`)
and ends with `dist.barrier()` and `dist.destroy_process_group()`; a function written for
kubetrain calls `lib.context()` and leaves the group to the runner. Both run unchanged, because
the runner makes no group before the call: it only registers the job's set-up
(`dist.set_up_on_first_use`: the job's backend and timeouts, from KUBETRAIN_CONFIG as the
built-in trainer reads them), which the first `lib.context()` runs when no group exists, and
`lib.context()` adopts a group the function initialised itself. Setting up before the call
(as the runner once did) made every Kubeflow-style function fail with "trying to initialize the
default process group twice"; which kind a function is shows only when it runs (reading its
source for `init_process_group` would guess, and miss a helper that calls it). A group the
function initialised itself has torch's defaults and the function's arguments, not the job's
timeouts. What kubetrain's own set-up does
before a group exists still happens first: `torch.distributed.nn` is imported (by
kubetrain.runtime.worker.dist here, and by the torchrun hooks' wrapper of `init_process_group` in any
worker), so a group the function destroys is freed and its threads do not outlive it.

It ends as the built-in trainer does: on success every rank meets, then each leaves with
`os._exit` (kubetrain.runtime.ending says why); after a failure at once, without a teardown that
could wait for a collective no peer will finish. The meeting (`dist.finish`) runs only where a
group is still initialised when the function returns: a function that destroyed its group met
its peers at its own barrier first, and one that never made a group has no peers to meet (the
torchrun agents' exit barrier still holds the nodes together).

Exit status: 0 when the function returned on this rank, 1 when it raised (its traceback is the
end of the log and, through torchrun's error file, of torchrun's failure summary: the pod's
termination message and so the job's failure message; two attempts in a row that fail with the
same error end the job, see kubetrain.operator.failures.repeated_error), 2 when DIR does not hold
a valid shipment.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from kubetrain.api.contract import CONFIG_ENV
from kubetrain.api.function_call import CALL_FILE, RUNNER_MODULE, SOURCE_FILE, Call, read_call
from kubetrain.runtime.ending import leave

# The shipped module's name on every rank; registered in sys.modules so that what its classes
# pickle (torch.save of an object of a shipped class) loads again in the same run.
MODULE_NAME = "kubetrain_shipped_function"


class ShipmentError(Exception):
    """DIR does not hold a loadable shipment."""


def load(directory: Path) -> tuple[Callable[..., Any], Call]:
    """The shipped function and its call; raises ShipmentError naming what is wrong."""
    try:
        call = read_call((directory / CALL_FILE).read_text())
    except OSError as error:
        raise ShipmentError(f"{directory / CALL_FILE}: {error.strerror}") from None
    except ValueError as error:
        raise ShipmentError(f"{directory / CALL_FILE}: not a function call: {error}") from None
    module = _import(directory / SOURCE_FILE)
    fn = getattr(module, call.function, None)
    if not callable(fn):
        raise ShipmentError(f"{directory / SOURCE_FILE} defines no function {call.function!r}")
    return fn, call


def _import(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
    if spec is None or spec.loader is None or not path.is_file():
        raise ShipmentError(f"{path}: no shipped module there")
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE_NAME] = module
    # Its imports run here: a module missing from this environment is the user's to fix, and
    # the message must say so (not "invalid shipment").
    spec.loader.exec_module(module)
    return module


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"torchrun -m {RUNNER_MODULE}", description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path, help="the directory holding the shipped function")
    args = parser.parse_args(argv)
    raw_rank = os.environ.get("RANK", "")
    rank = int(raw_rank) if raw_rank.isdigit() else 0
    # torch only now: a bad shipment is reported without paying for it.
    try:
        fn, call = load(args.directory)
    except ShipmentError as error:
        print(f"[rank {rank}] kubetrain function runner: {error}", file=sys.stderr)
        return 2
    except Exception:  # the shipped module's own imports and statements
        print(f"[rank {rank}] loading the shipped function failed:\n{traceback.format_exc()}", file=sys.stderr)
        return 1
    from kubetrain.runtime.worker import dist as kdist
    from kubetrain.runtime.worker.metrics import configure_logging, log

    configure_logging(rank)
    kdist.set_up_on_first_use(**job_set_up(os.environ.get(CONFIG_ENV, "")))
    try:
        fn(*call.args, **call.kwargs)
    except Exception as error:
        print(f"[rank {rank}] {call.function}() raised:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        _tell_torchrun(error)
        return 1
    if not kdist.initialized():
        return 0
    try:
        kdist.finish(kdist.current(), destroy=False)
    except Exception:  # a peer that failed after this rank's function returned
        log.exception("%s() returned, but the ranks' final meeting failed", call.function)
        return 1
    return 0


def job_set_up(config: str) -> dict[str, Any]:
    """The job's backend and timeouts for `dist.set_up_on_first_use`, from KUBETRAIN_CONFIG
    (TrainConfig's wire form), read without pydantic: the runner runs in images that lack it. A
    field the config leaves out keeps set_up_on_first_use's default (TrainConfig's too: a test
    keeps them equal)."""
    data = json.loads(config) if config else {}
    training = data.get("training") or {}
    found = {
        "backend": data.get("backend"),
        "timeout_s": training.get("processGroupTimeoutSeconds"),
        "connect_timeout_s": training.get("connectTimeoutSeconds"),
    }
    return {name: value for name, value in found.items() if value is not None}


def _tell_torchrun(error: Exception) -> None:
    """torchrun's failure summary, the last lines of the log and so the pod's termination message
    (a job's failure message), then names the exception instead of "To enable traceback see ..."."""
    from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

    with contextlib.suppress(OSError):
        ErrorHandler().record_exception(error)


if __name__ == "__main__":
    leave(main())
