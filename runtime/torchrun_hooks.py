"""Clean exits for any script under torchrun, the script unchanged.

Loaded at interpreter start-up — by the trainer image's `kubetrain-torchrun-hooks.pth`, and by the
`sitecustomize` first on PYTHONPATH in other images (the operator's runtime init container,
kubetrain.runtime.bundle) and for `kubetrain run --local` — and
inert until torch's own modules are imported: importing this module imports nothing of torch.
When they are, two of torch's exit races are closed where a user's script cannot close them:

* Workers: `init_process_group` first imports `torch.distributed.nn`. Imported later (DDP's
  construction does it), that module binds the default group into its functions' default
  arguments for the life of the process, so a script's `destroy_process_group()` cannot free
  the group and gloo's threads die at interpreter shutdown, racing peers that already left:
  "terminate called without an active exception" (SIGABRT) after a run that trained to the
  end. kubetrain.runtime.worker.dist does the same import for the built-in trainer.
* torchrun's agent: node 0's agent hosts the store that torchrun's exit barrier runs on and
  exits the moment the barrier opens; an agent that opened it from another node still has a
  request to make and logs "Error waiting on exit barrier" with a C++ trace
  (pytorch/pytorch#69520). Here node 0's agent enters the barrier only once every other
  agent waits in it (bounded by the barrier's own timeout), so the barrier opens on the
  store's host. torchrun runs the exit barrier only after its workers succeeded.

* torchrun itself ends with `os._exit` once its outcome is known (its error summary printed, its
  streams flushed): finalizing the thousands of modules torch loads took it 10-11 s after its
  workers had failed, on 2 loaded cores, and the pod's end (a recreated gang's start) waited.
* torchrun's static rendezvous: a node other than 0 waits for node 0's name and port at a short
  fixed interval before torch's store client connects (which retries a name that does not
  resolve yet with growing gaps), see kubetrain.runtime.reach.
* Progress and hang evidence for a script that reports neither (kubetrain.runtime.guest.step_watch): its
  optimizer steps beat a hang watchdog on every rank and, on rank 0, print `step` records.
* A Lightning script (kubetrain.runtime.guest.lightning_adapter, unless KUBETRAIN_ADAPTERS=off): progress
  records, its checkpoints in lastCheckpoint, the zero-loss stop and the watchdog, from a callback
  every `Trainer` gets in a torchrun worker.
* A Hugging Face `Trainer` script (kubetrain.runtime.guest.hf_adapter, unless KUBETRAIN_ADAPTERS=off): the
  same, from a callback added to transformers.trainer's DEFAULT_CALLBACKS.
* The in-place gang restart (runPolicy.restartStrategy InPlace, when KUBETRAIN_ATTEMPT_FILE is
  set): torchrun's agent holds a failed gang and restarts its workers when the pod is moved to
  the next attempt, starting them as forks of itself (torchrun's launch config then asks NVML,
  not the CUDA runtime, whether there are GPUs: its answer would leave the forks unable to use
  them); see kubetrain.runtime.agent.inplace.

The private torch names these hooks and the agent use live behind one wall,
kubetrain.runtime.torch_private: a torch that renamed one, or changed a parameter kubetrain
passes, gets torch's own behaviour for that feature, never a failure, and the job says so (a
`fallback` record, a RuntimeFallback Warning Event).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from kubetrain.runtime import ending, torch_private
from kubetrain.runtime.guest import attempt_store, step_watch
from kubetrain.runtime.store import hold_exit_barrier

log = logging.getLogger("kubetrain.torchrun_hooks")


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a callback right after a named module is first executed (a post-import hook)."""

    def __init__(self, callbacks: dict[str, Callable[[ModuleType], None]]) -> None:
        self.callbacks = callbacks

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        callback = self.callbacks.get(fullname)
        if callback is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        del self.callbacks[fullname]
        execute = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            execute(module)
            try:
                callback(module)
            except Exception:  # a hook must never break the user's import
                log.warning("kubetrain's torchrun hook for %s failed", fullname, exc_info=True)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _import_nn_before_init(module: ModuleType) -> None:
    """torch.distributed.distributed_c10d loaded: wrap init_process_group (both bindings)."""
    original = getattr(module, "init_process_group")  # noqa: B009
    if getattr(original, "_kubetrain_hooked", False):
        return

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        import torch.distributed.nn  # noqa: F401  (see the module docstring)

        # kubetrain.runtime.worker.dist passes a store of its own; a script's call passes none.
        scripted = kwargs.get("store") is None
        if attempt_store.needs_prefix(args, kwargs):
            kwargs = attempt_store.prefixed(kwargs)
        result = original(*args, **kwargs)
        step_watch.on_process_group(scripted=scripted)
        return result

    init_process_group.__wrapped__ = original  # type: ignore[attr-defined]
    init_process_group.__doc__ = original.__doc__
    init_process_group._kubetrain_hooked = True  # type: ignore[attr-defined]
    setattr(module, "init_process_group", init_process_group)  # noqa: B010  (mypy: torch is untyped here)
    package = sys.modules.get("torch.distributed")
    if package is not None and getattr(package, "init_process_group", None) is original:
        setattr(package, "init_process_group", init_process_group)  # noqa: B010


def _rebind_package(module: ModuleType) -> None:
    """torch.distributed loaded: its `from .distributed_c10d import *` copied the unwrapped name."""
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    wrapped = getattr(c10d, "init_process_group", None)
    if wrapped is not None and getattr(wrapped, "_kubetrain_hooked", False):
        setattr(module, "init_process_group", wrapped)  # noqa: B010


def _node0_enters_exit_barrier_last(module: ModuleType) -> None:
    """torch.distributed.elastic.agent.server.api loaded: wrap SimpleElasticAgent._exit_barrier."""

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        # Never None here (`patch` checked both of its names); node 0's workers hold on it too
        # (kubetrain.runtime.worker.dist).
        key = str(torch_private.exit_barrier_key())

        def _exit_barrier(self: Any) -> Any:
            try:
                store, group, timeout = torch_private.exit_barrier_of(self)
            except torch_private.Missing:
                return original(self)
            if not hold_exit_barrier(store, group.group_rank, group.group_world_size, key, timeout):
                log.warning("not every torchrun agent reached the exit barrier within %s s", timeout)
            return original(self)

        return _exit_barrier

    torch_private.patch(module, torch_private.NODE0_LAST, torch_private.EXIT_BARRIER, wrap)


def _exit_when_done(module: ModuleType) -> None:
    """torch.distributed.run loaded: its `main` ends the process when it returns or raises."""
    original = getattr(module, "main", None)
    if original is None or getattr(original, "_kubetrain_hooked", False):
        return

    def main(args: Any = None) -> Any:
        code: int = 0
        try:
            original(args)
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
            if not isinstance(done.code, int | None):
                print(done.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()  # what the interpreter would print for an uncaught exception
            code = 1
        ending.leave(code)

    main.__wrapped__ = original  # type: ignore[attr-defined]
    main._kubetrain_hooked = True  # type: ignore[attr-defined]
    setattr(module, "main", main)  # noqa: B010


def _wait_for_node0(module: ModuleType) -> None:
    from kubetrain.runtime.agent import inplace

    inplace.patch_static_rendezvous(module)


def _restart_in_place(module: ModuleType) -> None:
    from kubetrain.runtime.agent import inplace

    if inplace.enabled():
        inplace.patch_agent(module)


def _launch_config(module: ModuleType) -> None:
    torch_private.shutdown_timeout_read(module)
    from kubetrain.runtime.agent import inplace

    if inplace.enabled():
        inplace.patch_launch_config(module)


def _watch_steps(module: ModuleType) -> None:
    step_watch.on_optimizer_module(module)


# KUBETRAIN_ADAPTERS=off keeps the frameworks' adapters out of a script (set it in the container's
# command or image: a job's `env` may not set KUBETRAIN_* names); it then runs as without them.
ADAPTERS_ENV = "KUBETRAIN_ADAPTERS"


def adapters_enabled(environ: Any = None) -> bool:
    value = (os.environ if environ is None else environ).get(ADAPTERS_ENV, "")
    return value.strip().lower() not in ("off", "0", "false", "no")


def _adapt_lightning(module: ModuleType) -> None:
    """Lightning's trainer module loaded (either package name): kubetrain.runtime.guest.lightning_adapter."""
    if adapters_enabled():
        from kubetrain.runtime.guest import lightning_adapter

        lightning_adapter.install(module)


def _adapt_transformers(module: ModuleType) -> None:
    """transformers.trainer (which defines Trainer) loaded: kubetrain.runtime.guest.hf_adapter."""
    if adapters_enabled():
        from kubetrain.runtime.guest import hf_adapter

        hf_adapter.install(module)


def _warm_workers(module: ModuleType) -> None:
    from kubetrain.runtime.agent import inplace

    if inplace.enabled():
        inplace.patch_handler(module)


HOOKS: dict[str, Callable[[ModuleType], None]] = {
    "torch.distributed.distributed_c10d": _import_nn_before_init,
    "torch.distributed": _rebind_package,
    "torch.distributed.elastic.agent.server.api": _node0_enters_exit_barrier_last,
    "torch.distributed.elastic.rendezvous.static_tcp_rendezvous": _wait_for_node0,
    "torch.distributed.run": _exit_when_done,
    "torch.distributed.launcher.api": _launch_config,
    "torch.distributed.elastic.agent.server.local_elastic_agent": _restart_in_place,
    "torch.distributed.elastic.multiprocessing.subprocess_handler.subprocess_handler": _warm_workers,
    "torch.optim.optimizer": _watch_steps,
    "lightning.pytorch.trainer.trainer": _adapt_lightning,
    "pytorch_lightning.trainer.trainer": _adapt_lightning,
    "transformers.trainer": _adapt_transformers,
}


def install() -> None:
    """Idempotent; a no-op for modules already imported (nothing of torch is, at start-up)."""
    if any(isinstance(finder, _AfterImport) for finder in sys.meta_path):
        return
    pending = {name: hook for name, hook in HOOKS.items() if name not in sys.modules}
    if pending:
        sys.meta_path.insert(0, _AfterImport(pending))


install()
