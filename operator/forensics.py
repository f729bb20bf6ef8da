"""Pure: which rank hung, from the stacks every rank wrote to its log (kubetrain.runtime.worker.watchdog).

A rank that stops stepping for KUBETRAIN_STACKS_AFTER_SECONDS (half of hangTimeoutSeconds)
writes faulthandler's dump of all its threads; local rank i of a pod waits `seconds + i`, so a
dump's first line ("Timeout (0:00:12)!") says which process wrote it. When the gang is declared
Stalled the caller (the operator from `pods/log`, the local runner from its node logs) hands
the pods' log tails to `collect`, and `blame` names the culprit:

1. the rank whose main thread is not in the collective the others wait in (torch.distributed,
   or a DDP backward waiting for its all-reduce), with its innermost frame of user code;
2. else a rank that wrote no stacks while the others wait (its process is gone, or stuck where
   not even a C timer thread runs);
3. else, with three ranks or more, the one rank whose stack differs from all the others.
Otherwise nobody is blamed and the message says what was seen.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kubetrain.api.models import TrainingJobStatus

# Lines of each pod's log read for stacks: a few dumps of a few dozen threads each.
TAIL_LINES = 2000

_TIMEOUT = re.compile(r"^Timeout \((\d+):(\d\d):(\d\d)\)!\s*$")
_THREAD = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):\s*$")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.+?)\s*$')
# Frames of these are not the user's: torch, the standard library, kubetrain's own plumbing.
_LIBRARY = (
    "/torch/",
    "/threading.py",
    "/runpy.py",
    "/kubetrain/runtime/worker/watchdog.py",
    "/kubetrain/runtime/worker/stopping.py",
)
_WAITING = ("/torch/distributed/", "/torch/autograd/", "/torch/_tensor.py", "/torch/nn/parallel/distributed.py")


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    func: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.func}"


Stack = tuple[Frame, ...]  # most recent call first, as faulthandler prints


@dataclass(frozen=True)
class RankStacks:
    rank: int
    threads: tuple[Stack, ...]

    @property
    def main(self) -> Stack:
        """The thread that is not a `threading.Thread` (its outermost frame is not threading's bootstrap)."""
        for stack in self.threads:
            if stack and not stack[-1].file.endswith("threading.py"):
                return stack
        return self.threads[0] if self.threads else ()

    @property
    def waiting_in(self) -> str | None:
        """The collective (or DDP backward) the main thread waits in, or None."""
        for frame in self.main:
            if any(part in frame.file for part in _WAITING):
                return frame.func
        return None

    @property
    def user_frame(self) -> Frame | None:
        """The innermost frame of the main thread that is not torch, the stdlib or kubetrain's plumbing."""
        for frame in self.main:
            if not _library(frame.file):
                return frame
        return None


def _library(path: str) -> bool:
    if any(part in path for part in _LIBRARY):
        return True
    # The standard library: lib/pythonX.Y/ outside site-packages.
    return re.search(r"/lib/python3\.\d+/", path) is not None and "-packages/" not in path


# A worker forked by its torchrun agent (kubetrain.runtime.agent.warmstart, the in-place restart) runs
# inside the agent's call stack: the frames outside this one are the agent's, not the worker's.
_FORK = "/kubetrain/runtime/agent/warmstart.py"


def _worker_part(frames: list[Frame]) -> Stack:
    """A thread's frames up to (not including) the warm start's, when it is a forked worker's."""
    cut = next((index for index, frame in enumerate(frames) if frame.file.endswith(_FORK)), len(frames))
    return tuple(frames[:cut]) or tuple(frames)


def parse(text: str) -> dict[int, tuple[Stack, ...]]:
    """The last complete dump of each timeout in `text`: timeout seconds -> its threads' stacks."""
    dumps: dict[int, tuple[Stack, ...]] = {}
    seconds: int | None = None
    threads: list[list[Frame]] = []

    def close() -> None:
        if seconds is not None and threads and all(threads):
            dumps[seconds] = tuple(_worker_part(t) for t in threads)

    for line in text.splitlines():
        if match := _TIMEOUT.match(line):
            close()
            hours, minutes, secs = (int(g) for g in match.groups())
            seconds, threads = hours * 3600 + minutes * 60 + secs, []
        elif seconds is not None and _THREAD.match(line):
            threads.append([])
        elif seconds is not None and threads and (frame := _FRAME.match(line)):
            threads[-1].append(Frame(frame.group(1), int(frame.group(2)), frame.group(3)))
        elif seconds is not None and line.strip():
            close()
            seconds, threads = None, []
    close()
    return dumps


def collect(logs: Mapping[int, str], procs_per_node: int, stacks_after: int) -> dict[int, RankStacks]:
    """Every rank's stacks from its pod's log tail: `logs` maps node rank -> text."""
    found: dict[int, RankStacks] = {}
    for node, text in logs.items():
        for seconds, threads in parse(text).items():
            local = seconds - stacks_after
            if 0 <= local < procs_per_node:
                rank = node * procs_per_node + local
                found[rank] = RankStacks(rank, threads)
    return found


@dataclass(frozen=True)
class Blame:
    rank: int | None
    message: str


def _where(stacks: RankStacks) -> str:
    frame = stacks.user_frame or (stacks.main[0] if stacks.main else None)
    return f"at {frame}" if frame is not None else "with an empty stack"


def _ranks(ranks: Iterable[int]) -> str:
    listed = sorted(ranks)
    return ("rank " if len(listed) == 1 else "ranks ") + ", ".join(map(str, listed))


def blame(stacks: Mapping[int, RankStacks], world_size: int) -> Blame:
    if not stacks:
        return Blame(None, "no rank wrote its stacks (logs unreadable, or processes without kubetrain's hooks)")
    waiting = {r: s.waiting_in for r, s in stacks.items() if s.waiting_in is not None}
    idle = sorted(r for r in stacks if r not in waiting)
    missing = sorted(set(range(world_size)) - set(stacks))
    collective = sorted({str(name) for name in waiting.values()})
    seen = f"stacks of {len(stacks)} of {world_size} ranks in the logs"
    if waiting and idle:
        culprit = stacks[idle[0]]
        return Blame(
            idle[0],
            f"{_ranks(idle)} not in the collective {_ranks(waiting)} wait in ({', '.join(collective)}): "
            f"rank {idle[0]} {_where(culprit)}; {seen}",
        )
    if waiting and missing:
        return Blame(
            missing[0],
            f"{_ranks(missing)} wrote no stacks while {_ranks(waiting)} wait in {', '.join(collective)}; {seen}",
        )
    groups: dict[str, list[int]] = {}
    for rank, rank_stacks in stacks.items():
        groups.setdefault(_where(rank_stacks), []).append(rank)
    if len(stacks) >= 3 and len(groups) >= 2:
        smallest = min(groups.values(), key=len)
        if len(smallest) == 1 and sum(len(g) == 1 for g in groups.values()) == 1:
            rank = smallest[0]
            return Blame(rank, f"rank {rank}'s stack differs from every other rank's: {_where(stacks[rank])}; {seen}")
    where = "; ".join(f"{_ranks(ranks)} {place}" for place, ranks in sorted(groups.items(), key=lambda g: g[1]))
    return Blame(None, f"no single rank stands out: {where}; {seen}")


def wanted(previous: TrainingJobStatus | None, decided: TrainingJobStatus) -> bool:
    """Whether `decided` records a new Stalled failure: then the pods' logs are read for stacks
    and the stall decided again with them."""
    before = (previous.failures if previous is not None else None) or []
    after = decided.failures or []
    return after[-1:] != before[-1:] and after[-1].reason == "Stalled"
