"""Start a torchrun worker by forking its agent: torch and the worker's heavy modules are loaded already.

A worker that torchrun starts is a new interpreter: it imports torch again, and a training script
imports much more before its first step (an optimizer's first step alone loads torch._dynamo,
sympy and triton; the built-in trainer's data loads scikit-learn and scipy). On 2 cores that is
most of the seconds between a gang's restart and its first step. The agent already imported
torch; `preload` adds what workers import (PRELOAD, once, before the first start), and `fork`
starts each worker as a copy of that warm process running the worker's command line
(`python -u -m MODULE ...` or `python -u SCRIPT ...`) with the worker's environment, as
`subprocess.Popen` would have, with what a fresh interpreter would not have removed: the
agent's signal handlers, atexit hooks and open sockets (the rendezvous store's, the readiness
port's). The worker ends with `os._exit` after its own atexit hooks: there is nothing of the
agent to tear down.

Used by runtime/agent/inplace.py for every start of the workers of a job that restarts in place; other
command lines (not Python, numactl-wrapped, output redirected by torchrun) start as before.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib
import io
import logging
import os
import runpy
import signal
import stat
import subprocess
import sys
import time
import traceback
from collections.abc import Mapping, Sequence

from kubetrain.runtime import ending, torch_private

log = logging.getLogger("kubetrain.agent")

# Imported into the agent before its first workers start. For every script: what a torch
# training loop imports after `import torch` (an optimizer's first step imports torch._dynamo).
PRELOAD = (*torch_private.PRELOAD_MODULES, "torch.nn.parallel", "torch.utils.data")
# For a module run with `-m`: what its workers import besides.
PRELOAD_FOR_MODULE = {
    "kubetrain.trainer": (
        "kubetrain.trainer.train",
        "kubetrain.trainer.preflight",
        "sklearn.datasets",
        "sklearn.model_selection",
    ),
}
# Signals the agent handles (torchrun turns them into exceptions); a worker starts with the defaults.
RESET_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD)
WAIT_POLL_S = 0.01


def command(args: Sequence[str]) -> tuple[str, str, list[str]] | None:
    """("module" | "script", name, arguments) of a `python [-u] (-m MODULE | SCRIPT) ...` command
    line, or None for any other (only those run in a forked interpreter)."""
    if not args or os.path.realpath(args[0]) != os.path.realpath(sys.executable):
        return None
    rest = list(args[1:])
    if rest and rest[0] == "-u":
        rest = rest[1:]
    if len(rest) >= 2 and rest[0] == "-m":
        return "module", rest[1], rest[2:]
    if rest and not rest[0].startswith("-"):
        return "script", rest[0], rest[1:]
    return None


def preload(args: Sequence[str]) -> float:
    """Import PRELOAD (and the module's own list) into this process; the seconds it took. A module
    that fails to import is skipped: the worker imports it itself (and reports why)."""
    started = time.monotonic()
    parsed = command(args)
    names = list(PRELOAD)
    if parsed is not None and parsed[0] == "module":
        names += PRELOAD_FOR_MODULE.get(parsed[1], ())
    for name in names:
        try:
            importlib.import_module(name)
        except (ImportError, RuntimeError, OSError, ValueError, AttributeError) as error:
            # Not a broader class: torchrun turns SIGTERM into an Exception, which must stop the agent.
            log.info("not preloaded for the workers: %s (%s)", name, error)
    return time.monotonic() - started


class Forked:
    """The part of `subprocess.Popen` torchrun's SubprocessContext uses, for a forked worker."""

    def __init__(self, pid: int, args: Sequence[str]) -> None:
        self.pid = pid
        self.args = list(args)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere (a subreaper's sweep): it is gone
                self.returncode = -signal.SIGKILL
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(WAIT_POLL_S)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def fork(args: Sequence[str], env: Mapping[str, str]) -> Forked | None:
    """Start the worker `args` with `env` in a fork of this process (None: not a Python command
    line this can run; start it the usual way)."""
    parsed = command(args)
    if parsed is None:
        return None
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    gpus = _gpus()
    agent = os.getpid()
    pid = os.fork()
    if pid == 0:
        _die_with(agent)
        _become_worker(parsed, list(args), env, gpus)
    return Forked(pid, args)


PR_SET_PDEATHSIG = 1


def _die_with(agent: int) -> None:
    """In the child: the kernel SIGKILLs it when the agent's forking thread ends (PR_SET_PDEATHSIG),
    as a container takes every process with it. Locally a node's agent can die alone (the OOM
    killer, a kill): its workers, in sessions of their own, would otherwise live on, orphaned, a
    hung one for ever. torchrun forks its workers from its main thread, which ends only with it."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != agent:  # the agent died before the line above took effect
        os._exit(128 + signal.SIGKILL)


def _gpus() -> int:
    """CUDA devices this agent sees, asked without marking its forks (NVML first, as torch does;
    only where NVML cannot answer does torch ask CUDA, and then there is no GPU driver to break)."""
    torch = sys.modules.get("torch")
    count = getattr(getattr(torch, "cuda", None), "device_count", None)
    try:
        return int(count()) if count is not None else 0
    except (RuntimeError, OSError, ValueError):
        return 0


def _close_sockets() -> None:
    """Close every socket inherited from the agent: a worker holding the readiness listener would
    keep the pod Ready while its agent waits, one holding the store's would keep its port."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        with contextlib.suppress(OSError):
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                os.close(fd)


def cuda_unusable_after_fork(gpus: int) -> bool:
    """Whether this forked process would fail at its first CUDA call: there are GPUs, and its
    parent had asked the CUDA runtime about them (torch then marks every later fork), or this
    torch cannot say whether it did."""
    return gpus > 0 and torch_private.cuda_in_bad_fork() is not False


def _become_worker(parsed: tuple[str, str, list[str]], args: list[str], env: Mapping[str, str], gpus: int) -> None:
    """In the child: undo what is the agent's, then run the worker's command line. Never returns."""
    code = 1
    try:
        os.setsid()  # as torchrun's Popen(start_new_session=True): the agent stops it by its group
        for sig in RESET_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _close_sockets()
        if cuda_unusable_after_fork(gpus):
            # The same process (pid) runs the command line cold: right, only not warm.
            print(
                "[kubetrain] the agent used CUDA before this fork (or torch cannot tell): starting the worker cold",
                file=sys.stderr,
            )
            sys.stderr.flush()
            os.execve(args[0], args, dict(env))
        atexit._clear()
        os.environ.clear()
        os.environ.update(env)
        threads = env.get("OMP_NUM_THREADS", "")
        if threads.isdigit() and int(threads) > 0:
            # libgomp read the agent's environment when torch loaded; torch's pool follows this.
            import torch

            torch.set_num_threads(int(threads))
        for stream in (sys.stdout, sys.stderr):
            if isinstance(stream, io.TextIOWrapper):
                stream.reconfigure(write_through=True)  # python -u
        kind, name, arguments = parsed
        if kind == "module":
            sys.argv = [name, *arguments]
            sys.path[0] = os.getcwd()
            runpy.run_module(name, run_name="__main__", alter_sys=True)
        else:
            sys.argv = [name, *arguments]
            sys.path[0] = os.path.dirname(os.path.abspath(name))
            runpy.run_path(name, run_name="__main__")
        code = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        if not isinstance(done.code, int | None):
            print(done.code, file=sys.stderr)
    except KeyboardInterrupt:
        code = 128 + signal.SIGINT
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()
        finally:
            ending.leave(code)
