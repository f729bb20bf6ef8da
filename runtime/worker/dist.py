"""The env contract (api/contract.py) -> one initialised process group.

Everything here is what Kubeflow users trip over, made explicit: RANK is the process (never
the node), non-master ranks wait a bounded time for MASTER_ADDR:MASTER_PORT to resolve and
accept connections, and a rank whose WORLD_SIZE disagrees with rank 0's fails at once with a
message naming both instead of hanging in the backend's rendezvous until the timeout.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

# torch.distributed.nn.functional binds `group.WORLD` as default argument values when it is
# first imported, and DDP's construction imports it. Imported after init_process_group, those
# defaults hold the default process group for the life of the process: destroy_process_group
# cannot free it, so gloo's threads (and a master rank's TCPStore server) live on into
# interpreter shutdown, where a peer that already exited can abort this process ("terminate
# called without an active exception"). Imported here, before any group exists, they are None.
import torch.distributed.nn
from torch.distributed import PrefixStore, Store, TCPStore  # type: ignore[attr-defined]

from kubetrain.api import contract
from kubetrain.runtime import reach, torch_private
from kubetrain.runtime.store import (
    VERDICT_KEY,
    WORLD_SIZE_KEY,
    check_key,
    hold_exit_barrier,
    restart_count,
    run_key,
    trainer_prefix,
)
from kubetrain.runtime.worker.metrics import MetricsLogger

log = logging.getLogger("kubetrain.trainer")


class ContractError(RuntimeError):
    """The env contract is missing, malformed, or disagrees between ranks."""


class MasterUnreachableError(ContractError):
    """MASTER_ADDR:MASTER_PORT did not accept a connection within the connect timeout."""


@dataclass(frozen=True)
class DistEnv:
    """One process's place in the world, read from the env contract (and torchrun's additions)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    master_addr: str
    master_port: int


@dataclass(frozen=True)
class DistContext:
    """What a training process needs after set-up: its place, backend and device."""

    env: DistEnv
    backend: str
    device: torch.device
    # torchrun's store (hosted by node 0's agent) when this process runs under torchrun.
    agent_store: Store | None = None

    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @property
    def local_rank(self) -> int:
        return self.env.local_rank

    @property
    def is_rank0(self) -> bool:
        return self.env.rank == 0


# The context of the process group `setup` initialised (or `current` adopted), until `teardown`:
# code called inside someone else's `distributed()` (a function shipped by kubetrain.client)
# finds it here.
_current: DistContext | None = None
# What `current` sets up where no process group exists yet, once (`set_up_on_first_use`).
_on_first_use: Callable[[], DistContext] | None = None


def _int(environ: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = environ.get(name)
    if raw is None or raw == "":
        if default is None:
            raise ContractError(f"{name} is not set")
        return default
    try:
        return int(raw)
    except ValueError:
        raise ContractError(f"{name}={raw!r} is not an integer") from None


def read_env(environ: Mapping[str, str] | None = None) -> DistEnv:
    """Read and check the contract. With none of it set, a world of one on loopback."""
    environ = os.environ if environ is None else environ
    if contract.WORLD_SIZE not in environ and contract.RANK not in environ:
        if contract.NPROC_PER_NODE in environ and _int(environ, contract.NPROC_PER_NODE) > 1:
            raise ContractError(
                f"RANK is unset but NPROC_PER_NODE={environ[contract.NPROC_PER_NODE]}: run the script under "
                "torchrun, which starts one process per GPU and gives each its RANK"
            )
        port = environ.get(contract.MASTER_PORT) or str(contract.free_port())
        return DistEnv(0, 1, 0, 1, 0, environ.get(contract.MASTER_ADDR, "127.0.0.1"), int(port))
    if contract.RANK not in environ:
        raise ContractError(
            "WORLD_SIZE is set but RANK is not: with several processes per pod run under torchrun "
            "(RANK is per process; NODE_RANK is the pod)"
        )
    world_size = _int(environ, contract.WORLD_SIZE)
    rank = _int(environ, contract.RANK)
    local_world_size = _int(environ, contract.LOCAL_WORLD_SIZE, 1)
    local_rank = _int(environ, contract.LOCAL_RANK, 0)
    node_rank = _int(environ, contract.NODE_RANK, rank // max(local_world_size, 1))
    if world_size < 1:
        raise ContractError(f"WORLD_SIZE={world_size} must be at least 1")
    if not 0 <= rank < world_size:
        raise ContractError(f"RANK={rank} is outside WORLD_SIZE={world_size} (RANK counts processes, from 0)")
    if not 0 <= local_rank < local_world_size:
        raise ContractError(f"LOCAL_RANK={local_rank} is outside LOCAL_WORLD_SIZE={local_world_size}")
    master_addr = environ.get(contract.MASTER_ADDR, "")
    if world_size > 1 and not master_addr:
        raise ContractError(f"MASTER_ADDR is not set (WORLD_SIZE={world_size})")
    master_port = _int(environ, contract.MASTER_PORT, 29500)
    if not 0 < master_port < 65536:
        raise ContractError(f"MASTER_PORT={master_port} is not a TCP port")
    return DistEnv(rank, world_size, local_rank, local_world_size, node_rank, master_addr or "127.0.0.1", master_port)


def resolve_backend(requested: str) -> str:
    """`auto` is nccl when CUDA has GPUs, else gloo."""
    if requested == "auto":
        return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() > 0 else "gloo"
    if requested == "nccl" and not torch.cuda.is_available():
        raise ContractError("backend nccl needs CUDA GPUs, and this process sees none")
    return requested


def wait_for_master(host: str, port: int, timeout_s: float, *, interval_s: float = reach.INTERVAL_S) -> float:
    """Retry TCP connects to the master until one succeeds; return the seconds waited.

    Name resolution is retried too, at the same short fixed interval (runtime/reach.py): a
    headless Service's record appears only once the master pod has an IP, so early workers see
    "name does not resolve" for a while.
    """
    try:
        return reach.wait_for(host, port, timeout_s, interval_s=interval_s)
    except reach.Unreachable as exc:
        raise MasterUnreachableError(f"master {exc} (connectTimeoutSeconds={timeout_s:g})") from None


def _under_torchrun_agent() -> bool:
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def _make_store(env: DistEnv, timeout: datetime.timedelta) -> tuple[Store, Store]:
    """(this job's prefixed store, the raw TCPStore).

    Under torchrun with the agent's store, that store already listens on MASTER_PORT and
    every worker is a client; otherwise rank 0 hosts it. Mirrors torch's env:// handler, but
    without waiting for workers in the constructor: the contract check must run first, or a
    rank with a wrong WORLD_SIZE makes rank 0 wait for the full timeout.
    """
    agent = _under_torchrun_agent()
    store = TCPStore(
        env.master_addr,
        env.master_port,
        env.world_size,
        is_master=env.rank == 0 and not agent,
        timeout=timeout,
        wait_for_workers=False,
        multi_tenant=not agent,
    )
    # torchrun restarts workers against the same agent store: keep each attempt's keys apart.
    return PrefixStore(trainer_prefix(restart_count()), store), store


def check_world_agreement(store: Store, env: DistEnv) -> None:
    """Every rank compares its WORLD_SIZE with rank 0's; rank 0 announces one verdict to all.

    Without this, gloo and nccl wait for ranks that will never come until the
    process-group timeout (30 minutes by default), and the log says nothing useful.
    """
    if env.rank == 0:
        store.set(WORLD_SIZE_KEY, str(env.world_size))
        problems = []
        for rank in range(1, env.world_size):
            try:
                answer = store.get(check_key(rank)).decode()
            except (RuntimeError, dist.DistStoreError) as exc:
                answer = f"rank {rank} did not join the rendezvous at {env.master_addr}:{env.master_port} ({exc})"
            if answer != "ok":
                problems.append(answer)
        verdict = "; ".join(problems) or "ok"
        store.set(VERDICT_KEY, verdict)
    else:
        master_world = int(store.get(WORLD_SIZE_KEY).decode())
        if master_world != env.world_size:
            message = (
                f"rank {env.rank} has WORLD_SIZE={env.world_size} but rank 0 has WORLD_SIZE={master_world}: "
                "every process of a job must see the same WORLD_SIZE (NNODES x NPROC_PER_NODE)"
            )
            if env.rank < master_world:
                store.set(check_key(env.rank), message)
            raise ContractError(message)
        store.set(check_key(env.rank), "ok")
        verdict = store.get(VERDICT_KEY).decode()
    if verdict != "ok":
        raise ContractError(verdict)


def setup(
    backend: str = "auto",
    *,
    timeout_s: float = 1800,
    connect_timeout_s: float = 300,
    environ: Mapping[str, str] | None = None,
) -> DistContext:
    """Initialise the default process group from the env contract and pick this rank's device."""
    env = read_env(environ)
    backend = resolve_backend(backend)
    if backend == "nccl":
        # Abort collectives on a failed peer instead of hanging (the default in recent
        # torch; explicit so an older image behaves the same).
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
        if env.local_rank >= torch.cuda.device_count():
            raise ContractError(
                f"LOCAL_RANK={env.local_rank} but only {torch.cuda.device_count()} GPUs are visible: "
                "NPROC_PER_NODE must not exceed the GPUs per pod"
            )
        torch.cuda.set_device(env.local_rank)
        device = torch.device("cuda", env.local_rank)
    else:
        device = torch.device("cpu")
    if env.rank != 0:
        wait_for_master(env.master_addr, env.master_port, connect_timeout_s)
    # The contract check must not outlive the connect budget: a missing rank is a
    # start-up failure, not a 30-minute collective timeout.
    store, raw_store = _make_store(env, datetime.timedelta(seconds=max(connect_timeout_s, 1)))
    check_world_agreement(store, env)
    store.set_timeout(datetime.timedelta(seconds=timeout_s))
    dist.init_process_group(
        backend,
        store=store,
        rank=env.rank,
        world_size=env.world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
        device_id=device if backend == "nccl" else None,
    )
    # The attempt's timeline (api/records.py): when the gang's process group formed.
    MetricsLogger(env.rank, None).mark("rendezvous", world_size=env.world_size, backend=backend)
    # Only a client is kept: a master rank's own server must go with its process group.
    agent_store = raw_store if _under_torchrun_agent() else None
    global _current
    _current = DistContext(env=env, backend=backend, device=device, agent_store=agent_store)
    return _current


def initialized() -> bool:
    """Whether this process has a default process group (whoever initialised it)."""
    return dist.is_available() and dist.is_initialized()


def set_up_on_first_use(backend: str = "auto", *, timeout_s: float = 1800, connect_timeout_s: float = 300) -> None:
    """Let the first `current()` that finds no process group `setup` one with these arguments
    (the runner of shipped functions: a function may initialise its group itself instead)."""
    global _on_first_use
    _on_first_use = functools.partial(setup, backend, timeout_s=timeout_s, connect_timeout_s=connect_timeout_s)


def current() -> DistContext:
    """This process's DistContext while its process group is up: the one `setup` made, or, for a
    group the script initialised itself (`dist.init_process_group`), one adopted from it. With no
    group, the one `set_up_on_first_use` allows (at most once: a group its owner destroyed is
    not made again behind its back)."""
    global _on_first_use
    if initialized():
        return _current if _current is not None else adopt()
    if _current is None and _on_first_use is not None:
        make, _on_first_use = _on_first_use, None
        return make()
    raise ContractError(
        "no kubetrain process group: call this inside `lib.distributed()` or after `init_process_group` (in a "
        "function run by kubetrain.client's train(), the first call sets the group up)"
    )


def current_or_alone() -> DistContext:
    """`current()` where a default process group exists, else a world of one on the CPU: what a
    framework's Trainer runs in (kubetrain.trainer's adapters' stop vote), with or without a group."""
    if initialized():
        return current()
    return DistContext(env=read_env(), backend="none", device=torch.device("cpu"))


def adopt() -> DistContext:
    """The DistContext of a default process group initialised by someone else: its backend, rank
    and world size, this process's device (cuda:LOCAL_RANK with nccl), the rest of the env contract."""
    global _current
    backend = str(dist.get_backend())
    env = replace(read_env(), rank=dist.get_rank(), world_size=dist.get_world_size())
    device = torch.device("cuda", env.local_rank) if "nccl" in backend else torch.device("cpu")
    _current = DistContext(env=env, backend=backend, device=device)
    return _current


def teardown() -> None:
    global _current
    _current = None
    if initialized():
        dist.destroy_process_group()


def finish(ctx: DistContext, *, hold_timeout_s: float = 60, destroy: bool = True) -> None:
    """Successful end: every rank meets (after rank 0's last I/O), then tears down.

    Without the meeting a rank that finished first exits while its peers still use the
    connections. Only on success: after a failure some rank may never arrive, so failure
    paths call `teardown`. Under torchrun, node 0's processes then hold their agent back
    (see `hold_agent_store`). `destroy=False` leaves the group to a process that ends at
    once with `leave` (the built-in trainer): nothing it would free matters then.
    """
    if initialized():
        barrier(ctx)
    if destroy:
        teardown()
    if ctx.agent_store is not None and not hold_agent_store(ctx.agent_store, os.environ, timeout_s=hold_timeout_s):
        log.warning("not every node's torchrun agent reached its exit barrier within %g s", hold_timeout_s)


def hold_agent_store(store: Store, environ: Mapping[str, str], *, timeout_s: float, interval_s: float = 0.05) -> bool:
    """On node 0 under torchrun: return once every other node's agent waits in torchrun's exit barrier.

    Node 0's agent hosts the store that barrier runs on and exits as soon as the barrier
    opens. When another agent is the last to arrive, it still has a request to make after
    opening it, and if node 0's process is gone by then it logs "Error waiting on exit
    barrier" with a C++ trace (pytorch/pytorch#69520). Node 0's agent arrives only after its
    own workers exit, so a worker there that waits for the others makes node 0 arrive last:
    the barrier then opens on the host itself. Bounded: a node that never arrives (it failed)
    is the gang's business. True when every other agent arrived within `timeout_s`.
    """
    group_rank, group_world = environ.get("GROUP_RANK"), int(environ.get("GROUP_WORLD_SIZE", "1"))
    if group_rank != "0" or group_world < 2:
        return True
    key = torch_private.exit_barrier_key()
    if key is None:  # a torch that renamed its private names must still train, only unheld
        log.warning("this torch keys its exit barrier differently: node 0 does not wait for the other agents")
        return True
    # The agents count themselves in on PrefixStore(run_id); this store is the unprefixed one.
    return hold_exit_barrier(
        store, 0, group_world, run_key(environ.get("TORCHELASTIC_RUN_ID", "none"), key), timeout_s, interval_s
    )


@contextlib.contextmanager
def distributed(
    backend: str = "auto", *, timeout_s: float = 1800, connect_timeout_s: float = 300
) -> Iterator[DistContext]:
    """`with distributed() as ctx:` — set up; on leaving, all ranks meet and tear down (or just tear down on error)."""
    ctx = setup(backend, timeout_s=timeout_s, connect_timeout_s=connect_timeout_s)
    try:
        yield ctx
    except BaseException:
        teardown()
        raise
    finish(ctx)


def barrier(ctx: DistContext) -> None:
    if ctx.backend == "nccl":
        dist.barrier(device_ids=[ctx.local_rank])
    else:
        dist.barrier()
