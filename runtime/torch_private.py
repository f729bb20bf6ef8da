"""The wall: every private torch name kubetrain's runtime relies on, declared here and used only here.

What runs beside user code (kubetrain.runtime.torchrun_hooks, agent, warmstart) patches and calls
names torch does not promise to keep, and patches in place classes of torch's that offer no way to
change them (their names public, all the same). Each one is declared in NAMES (its module, class,
attribute and, for a callable, the parameters kubetrain passes), grouped by the behaviour that
needs it (FEATURES), and reached only through this module:

* a patch (`patch`) is applied only when every name of its feature exists, with those parameters;
* a call passes its arguments by keyword (`stop_workers`, `start_workers`, ...): a torch whose
  parameter changed meaning under the same position fails the check instead of running;
* an instance attribute is read when it is needed (`attribute`): absent, the call it serves does
  what torch alone would.

Where a check fails the feature falls back to torch's own behaviour, never a failure, and says so
once per process (as where kubetrain's own part of it fails, `failed`): a warning in the log and a
`fallback` record on stdout (kubetrain.runtime.records writes it, kubetrain.api.records parses it),
which the operator reads from node 0's log into status.runtimeFallbacks and a RuntimeFallback
Warning Event (the local runner shows the warning line). PRELOAD alone falls back unreported: the
preload only saves time, and checking it would import torch._dynamo into every agent at once.
tests/trainer/test_torch_private.py holds a canary per name and signature, run against the
installed torch.

Standard library only (and kubetrain.runtime.records); torch is imported lazily, by the callers'
post-import hooks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import logging
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any, Literal

from kubetrain.api.record_format import FALLBACK as FALLBACK_EVENT
from kubetrain.runtime import records

log = logging.getLogger("kubetrain.torch_private")

AGENT_API = "torch.distributed.elastic.agent.server.api"
LOCAL_AGENT = "torch.distributed.elastic.agent.server.local_elastic_agent"
STORE_UTILS = "torch.distributed.elastic.utils.store"
HANDLER = "torch.distributed.elastic.multiprocessing.subprocess_handler.subprocess_handler"
STATIC_RENDEZVOUS = "torch.distributed.elastic.rendezvous.static_tcp_rendezvous"
LAUNCHER = "torch.distributed.launcher.api"

Kind = Literal["method", "attribute", "constant", "function", "module"]


@dataclasses.dataclass(frozen=True)
class Private:
    """One private torch name. `kind`: a method of `owner` (a class of `module`), an attribute
    its instances get in their constructor, a constant or a function of `module`, or `module`
    itself. `params`: the parameters kubetrain passes to a callable, by keyword; for a method
    kubetrain wraps (`wrapped`), every parameter after `self`, in order, as torch calls it
    positionally and the wrapper takes exactly these."""

    module: str
    owner: str | None
    name: str
    kind: Kind
    params: tuple[str, ...] = ()
    wrapped: bool = False

    def __str__(self) -> str:
        where = f"{self.owner or self.module}.{self.name}" if self.name else self.module
        return f"{where}({', '.join(self.params)})" if self.kind in ("method", "function") else where


EXIT_BARRIER = Private(AGENT_API, "SimpleElasticAgent", "_exit_barrier", "method", wrapped=True)
WORKER_GROUP = Private(AGENT_API, "SimpleElasticAgent", "_worker_group", "attribute")
EXIT_BARRIER_TIMEOUT = Private(AGENT_API, "SimpleElasticAgent", "_exit_barrier_timeout", "attribute")
AGENT_STORE = Private(AGENT_API, "SimpleElasticAgent", "_store", "attribute")
SYNC_ID = Private(AGENT_API, None, "_TERMINAL_STATE_SYNC_ID", "constant")
NUM_MEMBERS = Private(STORE_UTILS, None, "_NUM_MEMBERS", "constant")

START_WORKERS = Private(LOCAL_AGENT, "LocalElasticAgent", "_start_workers", "method", ("worker_group",), True)
MONITOR_WORKERS = Private(LOCAL_AGENT, "LocalElasticAgent", "_monitor_workers", "method", ("worker_group",), True)
INITIALIZE_WORKERS = Private(LOCAL_AGENT, "LocalElasticAgent", "_initialize_workers", "method", ("worker_group",), True)
STOP_WORKERS = Private(LOCAL_AGENT, "LocalElasticAgent", "_stop_workers", "method", ("worker_group",))
SHUTDOWN = Private(LOCAL_AGENT, "LocalElasticAgent", "_shutdown", "method", ("death_sig", "timeout"))
REMAINING_RESTARTS = Private(AGENT_API, "SimpleElasticAgent", "_remaining_restarts", "attribute")

POPEN = Private(HANDLER, "SubprocessHandler", "_popen", "method", ("args", "env"), True)
HANDLER_STDOUT = Private(HANDLER, "SubprocessHandler", "_stdout", "attribute")
HANDLER_STDERR = Private(HANDLER, "SubprocessHandler", "_stderr", "attribute")
CUDA_IN_BAD_FORK = Private("torch.cuda", None, "_is_in_bad_fork", "function")
DYNAMO = Private("torch._dynamo", None, "", "module")

RENDEZVOUS_STORE = Private(STATIC_RENDEZVOUS, "StaticTCPRendezvous", "_store", "attribute")
# Public names, but of a class torch documents no way to change: its rendezvous is wrapped, its
# attributes read (node 0's address, the timeout), and an elastic gang's resize sets three of them.
NEXT_RENDEZVOUS = Private(STATIC_RENDEZVOUS, "StaticTCPRendezvous", "next_rendezvous", "method", wrapped=True)
RENDEZVOUS_RANK = Private(STATIC_RENDEZVOUS, "StaticTCPRendezvous", "rank", "attribute")
RENDEZVOUS_WORLD_SIZE = Private(STATIC_RENDEZVOUS, "StaticTCPRendezvous", "world_size", "attribute")
RENDEZVOUS_RUN_ID = Private(STATIC_RENDEZVOUS, "StaticTCPRendezvous", "run_id", "attribute")
RENDEZVOUS_MASTER_ADDR = Private(STATIC_RENDEZVOUS, "StaticTCPRendezvous", "master_addr", "attribute")
RENDEZVOUS_MASTER_PORT = Private(STATIC_RENDEZVOUS, "StaticTCPRendezvous", "master_port", "attribute")
RENDEZVOUS_TIMEOUT = Private(STATIC_RENDEZVOUS, "StaticTCPRendezvous", "timeout", "attribute")
# A dataclass's own hook, wrapped: the launch config's question about GPUs is asked in it.
LAUNCH_CONFIG_INIT = Private(LAUNCHER, "LaunchConfig", "__post_init__", "method", wrapped=True)


@dataclasses.dataclass(frozen=True)
class Feature:
    """What kubetrain does with some private names, and what torch does where they are missing."""

    key: str
    does: str
    instead: str
    names: tuple[Private, ...]


NODE0_LAST = Feature(
    "exit-barrier",
    "node 0's agent entering torchrun's exit barrier last",
    "torchrun's own exit barrier (an agent may log 'Error waiting on exit barrier' at a clean end)",
    (EXIT_BARRIER, WORKER_GROUP, EXIT_BARRIER_TIMEOUT, AGENT_STORE, SYNC_ID, NUM_MEMBERS),
)
IN_PLACE = Feature(
    "in-place-restart",
    "in-place gang restarts",
    "torchrun's own restart: a failure recreates the gang",
    (START_WORKERS, MONITOR_WORKERS, INITIALIZE_WORKERS, STOP_WORKERS, REMAINING_RESTARTS),
)
KILL_AT_ONCE = Feature(
    "kill-at-once",
    "killing a broken gang's workers at once",
    "torchrun's own stop: SIGTERM, then SIGKILL after its shutdown timeout",
    (SHUTDOWN,),
)
WARM_START = Feature(
    "warm-start",
    "workers started as forks of the agent",
    "workers start cold, as new processes",
    (POPEN, HANDLER_STDOUT, HANDLER_STDERR),
)
FORK_CUDA_CHECK = Feature(
    "fork-cuda-check",
    "telling whether a forked worker can use CUDA",
    "forked workers start cold where there are GPUs",
    (CUDA_IN_BAD_FORK,),
)
PRELOAD = Feature(
    "preload",
    "preloading what an optimizer's first step imports",
    "workers import it themselves",
    (DYNAMO,),
)
NODE0_WAIT = Feature(
    "wait-for-node0",
    "waiting for node 0's name at a fixed interval",
    "torch's store client retries with growing gaps",
    (
        NEXT_RENDEZVOUS,
        RENDEZVOUS_STORE,
        RENDEZVOUS_RANK,
        RENDEZVOUS_MASTER_ADDR,
        RENDEZVOUS_MASTER_PORT,
        RENDEZVOUS_TIMEOUT,
    ),
)
RESIZE = Feature(
    "resize-in-place",
    "restarting an elastic gang in place at another size",
    "the gang restarts at its first size, and a resize waits until the operator recreates it",
    (
        NEXT_RENDEZVOUS,
        RENDEZVOUS_RANK,
        RENDEZVOUS_WORLD_SIZE,
        RENDEZVOUS_RUN_ID,
        RENDEZVOUS_MASTER_ADDR,
        RENDEZVOUS_MASTER_PORT,
    ),
)
NVML_CHECK = Feature(
    "nvml-gpu-check",
    "torchrun's launch config asking NVML, not the CUDA runtime, whether there are GPUs",
    "it asks the CUDA runtime, and workers forked from the agent start cold where there are GPUs",
    (LAUNCH_CONFIG_INIT,),
)
FEATURES = (
    NODE0_LAST,
    IN_PLACE,
    KILL_AT_ONCE,
    WARM_START,
    FORK_CUDA_CHECK,
    NVML_CHECK,
    PRELOAD,
    NODE0_WAIT,
    RESIZE,
)
# Each name once, though two features may need it (the static rendezvous's).
NAMES = tuple(dict.fromkeys(name for feature in FEATURES for name in feature.names))

# Not private, but a torch version's boundary the save budget relies on: torchrun reads
# PET_SHUTDOWN_TIMEOUT into LaunchConfig.shutdown_timeout from torch 2.10; before, SIGTERM to the
# agent gives its workers torch's fixed 30 s.
SHUTDOWN_TIMEOUT_ENV = "PET_SHUTDOWN_TIMEOUT"
SHUTDOWN_TIMEOUT_FIELD = "shutdown_timeout"
TORCH_SHUTDOWN_S = 30

_reported: set[str] = set()


# --- checks ------------------------------------------------------------------------------


def _module(name: str, loaded: ModuleType | None = None) -> ModuleType | None:
    if loaded is not None and loaded.__name__ == name:
        return loaded
    try:
        return sys.modules.get(name) or importlib.import_module(name)
    except ImportError:
        return None


def _params(function: Any) -> list[str] | None:
    try:
        return list(inspect.signature(function).parameters)
    except (TypeError, ValueError):  # a builtin without a signature
        return None


def lacks(name: Private, loaded: ModuleType | None = None) -> bool:
    """Whether this torch lacks `name` (a method's parameters included). An instance attribute
    is checked on its class's existence only: `attribute` reads it when it is needed."""
    module = _module(name.module, loaded)
    if module is None:
        return True
    if name.kind == "module":
        return False
    holder: Any = getattr(module, name.owner, None) if name.owner else module
    if holder is None:
        return True
    if name.kind == "attribute":
        return False
    found = getattr(holder, name.name, None)
    if found is None:
        return True
    if name.kind == "constant":
        return False
    if not callable(found):
        return True
    params = _params(found)  # None: a builtin that does not say; called without arguments
    if params is None:
        return bool(name.params)
    if name.wrapped:
        return params[1:] != list(name.params)
    return not set(name.params) <= set(params)


def missing(feature: Feature, loaded: ModuleType | None = None) -> list[Private]:
    return [name for name in feature.names if lacks(name, loaded)]


def torch_version() -> str:
    return str(getattr(sys.modules.get("torch"), "__version__", "unknown"))


def fallback(feature: Feature, gone: list[Private] | list[str]) -> None:
    """Say once per process that `feature` falls back to torch's own behaviour: a warning, and a
    `fallback` record on stdout (the pod's log, which the operator reads)."""
    lacking = ", ".join(map(str, gone))
    _report(feature, gone, f"torch {torch_version()} has no {lacking}: instead of {feature.does}, {feature.instead}")


def failed(feature: Feature, error: Exception, instead: str) -> None:
    """Say once per process that kubetrain's own code for `feature` failed (a bug, whatever the
    torch) and torch's own behaviour ran `instead`: the warning and `fallback` record of a torch
    without a name, with nothing missing. The caller logs the traceback."""
    _report(
        feature, [], f"{feature.does} failed under torch {torch_version()} ({type(error).__name__}: {error}): {instead}"
    )


def _report(feature: Feature, gone: list[Private] | list[str], message: str) -> None:
    if feature.key in _reported:
        return
    _reported.add(feature.key)
    log.warning("%s", message)
    record = {"feature": feature.key, "torch": torch_version(), "missing": [str(n) for n in gone], "message": message}
    records.write(FALLBACK_EVENT, record, stream=sys.stdout, attempt_from_env=False)


def usable(feature: Feature, loaded: ModuleType | None = None) -> bool:
    """Whether every name of `feature` is there; if not, the fallback is reported."""
    gone = missing(feature, loaded)
    if gone:
        fallback(feature, gone)
    return not gone


_ABSENT = object()


class Missing(LookupError):
    """An instance attribute this torch does not set."""


def attribute(instance: Any, name: Private, feature: Feature) -> Any:
    """`instance`'s private attribute `name`; Missing (the fallback reported) where it has none."""
    value = getattr(instance, name.name, _ABSENT)
    if value is _ABSENT:
        fallback(feature, [name])
        raise Missing(str(name))
    return value


# --- patches -----------------------------------------------------------------------------


def patch(
    module: ModuleType, feature: Feature, target: Private, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]
) -> bool:
    """Replace `target` (a method of a class of `module`) by `wrap(original)` if every name of
    `feature` is there; else leave torch as it is and report the fallback. Whether it patched."""
    if not usable(feature, module):
        return False
    owner = getattr(module, str(target.owner))
    setattr(owner, target.name, wrap(getattr(owner, target.name)))
    return True


# --- the exit barrier -------------------------------------------------------------------


def exit_barrier_key() -> str | None:
    """The key, in the run's store, under which torchrun's agents count themselves in at its exit
    barrier; None where this torch names it otherwise."""
    api, store = _module(SYNC_ID.module), _module(NUM_MEMBERS.module)
    sync_id, members = getattr(api, SYNC_ID.name, None), getattr(store, NUM_MEMBERS.name, None)
    if sync_id is None or members is None:
        return None
    return f"{sync_id}{members}"


def exit_barrier_of(agent: Any) -> tuple[Any, Any, float]:
    """An agent's (store, worker group, exit-barrier timeout); Missing where one is not there."""
    return (
        attribute(agent, AGENT_STORE, NODE0_LAST),
        attribute(agent, WORKER_GROUP, NODE0_LAST),
        attribute(agent, EXIT_BARRIER_TIMEOUT, NODE0_LAST),
    )


# --- the agent's workers ----------------------------------------------------------------


def start_workers(original: Callable[..., Any], agent: Any, group: Any) -> Any:
    return original(agent, worker_group=group)


def monitor_workers(original: Callable[..., Any], agent: Any, group: Any) -> Any:
    return original(agent, worker_group=group)


def initialize_workers(agent: Any, group: Any, original: Callable[..., Any] | None = None) -> None:
    """The agent's rendezvous and worker start (`original`: torch's own, from a wrapper of it)."""
    if original is None:
        agent._initialize_workers(worker_group=group)
    else:
        original(agent, worker_group=group)


def set_remaining_restarts(agent: Any, remaining: int) -> None:
    """torchrun's restarts left (its workers' restart count, kubetrain.runtime.store.restart_count,
    derives from them); left alone where this torch counts them otherwise."""
    with contextlib.suppress(Missing):
        attribute(agent, REMAINING_RESTARTS, IN_PLACE)
        agent._remaining_restarts = remaining


def stop_workers(agent: Any, group: Any, death_sig: int, timeout: float) -> None:
    """Stop the workers with `death_sig` within `timeout` s; torch's own stop (SIGTERM first) where
    its shutdown takes other parameters."""
    if usable(KILL_AT_ONCE):
        agent._shutdown(death_sig=death_sig, timeout=timeout)
    else:
        agent._stop_workers(worker_group=group)


def popen(original: Callable[..., Any], handler: Any, args: tuple[str, ...], env: dict[str, str]) -> Any:
    return original(handler, args=args, env=env)


def output_redirected(handler: Any) -> bool:
    """Whether torchrun redirects the worker's output (then it must start as torch starts it);
    True where this torch's handler keeps it under other names."""
    try:
        stdout = attribute(handler, HANDLER_STDOUT, WARM_START)
        stderr = attribute(handler, HANDLER_STDERR, WARM_START)
    except Missing:
        return True
    return stdout is not None or stderr is not None


def rendezvous_store(rendezvous: Any) -> Any:
    """The store a static rendezvous connected to (node 0's), or None: not connected yet, or a
    torch that keeps it under another name."""
    try:
        return attribute(rendezvous, RENDEZVOUS_STORE, NODE0_WAIT)
    except Missing:
        return None


def rendezvous_connected(rendezvous: Any) -> bool:
    """Whether a static rendezvous already holds its store (then there is nothing to wait for);
    True where this torch keeps it under another name (torch's own client then connects)."""
    try:
        return attribute(rendezvous, RENDEZVOUS_STORE, NODE0_WAIT) is not None
    except Missing:
        return True


def rendezvous_master(rendezvous: Any, feature: Feature) -> tuple[str, int] | None:
    """Node 0's (address, port), where a static rendezvous connects; None where this torch keeps
    them under other names (then `feature`, the caller's, falls back)."""
    try:
        return (
            str(attribute(rendezvous, RENDEZVOUS_MASTER_ADDR, feature)),
            int(attribute(rendezvous, RENDEZVOUS_MASTER_PORT, feature)),
        )
    except Missing:
        return None


def node0_to_wait_for(rendezvous: Any) -> tuple[str, int, float] | None:
    """What a static rendezvous on a node other than 0 waits for before torch's client connects:
    node 0's (address, port) and the rendezvous's timeout in seconds. None where there is nothing
    to wait for (node 0 hosts the store, or the rendezvous holds it already) or this torch keeps
    them under other names (torch's own client then connects)."""
    if rendezvous_connected(rendezvous):
        return None
    try:
        if attribute(rendezvous, RENDEZVOUS_RANK, NODE0_WAIT) == 0:
            return None
        timeout = attribute(rendezvous, RENDEZVOUS_TIMEOUT, NODE0_WAIT)
    except Missing:
        return None
    master = rendezvous_master(rendezvous, NODE0_WAIT)
    if master is None:
        return None
    # 900 s: torchrun's own rendezvous timeout, where this one has none.
    return (*master, timeout.total_seconds() if timeout is not None else 900.0)


def rendezvous_membership(rendezvous: Any) -> tuple[int, int, str] | None:
    """A static rendezvous's (rank, world size, run id); None where this torch keeps them otherwise."""
    try:
        return (
            int(attribute(rendezvous, RENDEZVOUS_RANK, RESIZE)),
            int(attribute(rendezvous, RENDEZVOUS_WORLD_SIZE, RESIZE)),
            str(attribute(rendezvous, RENDEZVOUS_RUN_ID, RESIZE)),
        )
    except Missing:
        return None


def set_rendezvous_membership(rendezvous: Any, rank: int, world_size: int, run_id: str) -> None:
    """The static rendezvous's next round at this rank of this many nodes, its keys under `run_id`
    (torch's agents keep their rank assignments in the store under it: a new id per attempt keeps
    a smaller gang from reading the assignments of a larger one)."""
    rendezvous.rank, rendezvous.world_size, rendezvous.run_id = rank, world_size, run_id


# --- forks and preloads -----------------------------------------------------------------


def cuda_in_bad_fork() -> bool | None:
    """Whether torch marked this forked process unable to use CUDA; None where this torch cannot
    tell (then a fork must assume it is)."""
    cuda = sys.modules.get(CUDA_IN_BAD_FORK.module)
    check = getattr(cuda, CUDA_IN_BAD_FORK.name, None)
    return bool(check()) if check is not None else None


PRELOAD_MODULES = (DYNAMO.module,)


# --- the shutdown budget ----------------------------------------------------------------


def shutdown_timeout_read(module: ModuleType) -> bool:
    """torch.distributed.launcher.api loaded: whether its LaunchConfig takes torchrun's shutdown
    timeout (PET_SHUTDOWN_TIMEOUT); where it is set and this torch ignores it, the fallback is
    reported: a stopped pod's workers get TORCH_SHUTDOWN_S to save, not the grace period."""
    config = getattr(module, "LaunchConfig", None)
    fields = {field.name for field in dataclasses.fields(config)} if dataclasses.is_dataclass(config) else set()
    if SHUTDOWN_TIMEOUT_FIELD in fields:
        return True
    wanted = os.environ.get(SHUTDOWN_TIMEOUT_ENV)
    if wanted:
        budget = Feature(
            "shutdown-timeout",
            f"{SHUTDOWN_TIMEOUT_ENV}={wanted} (a stopped pod's {wanted} s to save its last step)",
            f"torch's fixed {TORCH_SHUTDOWN_S} s from SIGTERM to SIGKILL",
            (),
        )
        fallback(budget, [f"LaunchConfig.{SHUTDOWN_TIMEOUT_FIELD}"])
    return False
