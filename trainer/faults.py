"""Fault injection for drills and tests: `KUBETRAIN_FAULT` makes one rank fail at a known step.

    KUBETRAIN_FAULT="exit,rank=1,step=30"          rank 1 exits with code 1 after optimizer step 30
    KUBETRAIN_FAULT="exit,rank=1,step=30,code=3"   ... with exit code 3
    KUBETRAIN_FAULT="kill,rank=1,step=30"          ... SIGKILLs itself (a segfault-like death, 137)
    KUBETRAIN_FAULT="raise,rank=1,step=30"         ... raises (a Python exception: the trainer exits 1)
    KUBETRAIN_FAULT="hang,rank=1,step=30"          ... blocks forever outside any collective
    KUBETRAIN_FAULT="slow,rank=0,step=30,ms=500"   ... and every step after it takes 500 ms longer (a
                                                   slow rank; the run still trains, and stays stoppable;
                                                   an attempt resumed past step 30 is slow from its first)

A fault fires once per job: before firing, the rank writes a marker under
`<checkpoint.dir>/.faults/`, and a later attempt that finds it trains on. (The checkpoint
volume outlives restarts; with an emptyDir and a recreated gang the marker is lost with it.)
`once=false` fires in every attempt that reaches the step.

Holding a run at a known point by construction is what lets a test kill a rank mid-training
without racing a run that is about to finish. The name is the one `KUBETRAIN_*` variable a
TrainingJob's `env` may set (api/contract.py).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from kubetrain.api.contract import FAULT_ENV as ENV
from kubetrain.runtime import ending

Kind = Literal["exit", "kill", "raise", "hang", "slow"]
KINDS: tuple[str, ...] = get_args(Kind)

log = logging.getLogger("kubetrain.trainer")


class FaultSpecError(ValueError):
    """KUBETRAIN_FAULT does not parse; the message names the part."""


class InjectedFault(RuntimeError):
    """Raised by a `raise` fault."""


@dataclass(frozen=True)
class Fault:
    kind: Kind
    rank: int
    step: int
    code: int = 1
    once: bool = True
    ms: int = 0

    @property
    def key(self) -> str:
        return f"{self.kind}-rank{self.rank}-step{self.step}"


def parse(text: str) -> Fault:
    """`kind,rank=R,step=N[,code=C][,ms=M][,once=true|false]`."""
    kind, *pairs = [part.strip() for part in text.split(",")]
    if kind not in KINDS:
        raise FaultSpecError(f"{ENV}={text!r}: kind {kind!r} is not one of {', '.join(KINDS)}")
    fields: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or name not in ("rank", "step", "code", "ms", "once"):
            raise FaultSpecError(f"{ENV}={text!r}: {pair!r} is not rank=, step=, code=, ms= or once=")
        fields[name] = value
    for required in ("rank", "step"):
        if required not in fields:
            raise FaultSpecError(f"{ENV}={text!r}: {required}= is missing")
    numbers: dict[str, int] = {}
    for name in ("rank", "step", "code", "ms"):
        if name in fields:
            try:
                numbers[name] = int(fields[name])
            except ValueError:
                raise FaultSpecError(f"{ENV}={text!r}: {name}={fields[name]!r} is not an integer") from None
            if numbers[name] < 0:
                raise FaultSpecError(f"{ENV}={text!r}: {name} must not be negative")
    once = fields.get("once", "true").lower()
    if once not in ("true", "false"):
        raise FaultSpecError(f"{ENV}={text!r}: once={once!r} is not true or false")
    if kind == "slow" and numbers.get("ms", 0) <= 0:
        raise FaultSpecError(f"{ENV}={text!r}: slow needs ms= (the delay per step, in milliseconds)")
    return Fault(
        kind,  # type: ignore[arg-type]
        numbers["rank"],
        numbers["step"],
        numbers.get("code", 1),
        once == "true",
        numbers.get("ms", 0),
    )


def from_env_checked(environ: dict[str, str] | None = None) -> Fault | None:
    """The job's fault, parsed early so that a typo is a usage error before torch loads."""
    text = (environ if environ is not None else os.environ).get(ENV, "").strip()
    return parse(text) if text else None


class FaultPoint:
    """This rank's fault, if any; `reached(step)` costs one comparison while it is not due."""

    def __init__(self, fault: Fault | None, rank: int, marker_dir: Path | None) -> None:
        self.fault = fault if fault is not None and fault.rank == rank else None
        self.slowing = False
        self.marker = marker_dir / ".faults" / self.fault.key if self.fault and marker_dir else None
        if self.fault is not None and self.fault.once and self.marker is not None and self.marker.exists():
            log.info("%s %s already fired in an earlier attempt: not again", ENV, self.fault.key)
            self.fault = None

    @classmethod
    def from_env(cls, rank: int, marker_dir: str | Path | None, environ: dict[str, str] | None = None) -> FaultPoint:
        return cls(from_env_checked(environ), rank, Path(marker_dir) if marker_dir else None)

    def reached(self, step: int) -> None:
        if self.fault is None:
            return
        if self.slowing:
            time.sleep(self.fault.ms / 1000)
            return
        # A slow rank stays slow in an attempt that resumed past its step (once=false).
        if step != self.fault.step and not (self.fault.kind == "slow" and step > self.fault.step):
            return
        fault = self.fault
        if fault.kind == "slow":
            self.slowing = True
        else:
            self.fault = None
        if self.marker is not None:
            self.marker.parent.mkdir(parents=True, exist_ok=True)
            with open(self.marker, "w") as out:
                out.write(f"{time.time()}\n")
                out.flush()
                os.fsync(out.fileno())
        log.warning("%s: injecting %s at step %d", ENV, fault.kind, step)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        if fault.kind == "exit":
            ending.leave(fault.code)
        if fault.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if fault.kind == "raise":
            raise InjectedFault(f"{ENV}: injected failure at step {step}")
        if fault.kind == "slow":
            time.sleep(fault.ms / 1000)
            return
        while True:  # hang: outside any collective, as a stuck data loader or a deadlocked user thread would
            time.sleep(3600)
