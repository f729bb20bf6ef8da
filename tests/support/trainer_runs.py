"""Helpers for the trainer tests: launch real processes with the operator's env contract.

Each rank is a separate `python` process on 127.0.0.1 with exactly the variables a
one-process pod gets (kubetrain.api.contract.rendezvous_env), one thread each: the
machine is small and shared.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubetrain.api import contract
from kubetrain.api.contract import free_port
from kubetrain.api.records import metrics_in
from kubetrain.api.training import CONFIG_ENV, TrainConfig
from kubetrain.local.processes import ProcessTree, stop

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in contract.RESERVED_ENV and not k.startswith("PET_")}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


@dataclass
class Gang:
    """The process trees of one launch, stopped (every worker too) if a test leaves them running."""

    trees: list[ProcessTree] = field(default_factory=list)

    @property
    def procs(self) -> list[subprocess.Popen[str]]:
        return [tree.proc for tree in self.trees]

    def wait(self, timeout: float = 180) -> list[tuple[int, str, str]]:
        """(returncode, stdout, stderr) per rank; every rank is reaped even if one times out."""
        deadline = time.monotonic() + timeout
        results = []
        for proc in self.procs:
            try:
                out, err = proc.communicate(timeout=max(deadline - time.monotonic(), 1))
            except subprocess.TimeoutExpired:
                self.kill()
                out, err = proc.communicate()
                err += f"\n[test] killed after {timeout} s"
            results.append((proc.returncode, out, err))
        return results

    def kill(self) -> None:
        # torchrun starts each worker in a session of its own: killing torchrun's group alone
        # would leave the workers running. The supervision module stops every noted group.
        stop(self.trees, grace_s=0)


def spawn(command: list[str], env: dict[str, str], cwd: Path) -> ProcessTree:
    """One launch as a process tree of its own, so cleanup reaches torchrun's workers too."""
    return ProcessTree.start(command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def records(stdout: str) -> list[dict[str, Any]]:
    """The metrics records (not the start-up marks: api.records.metrics_in)."""
    return metrics_in(stdout)


class Launcher:
    def __init__(self) -> None:
        self.gangs: list[Gang] = []

    def ranks(
        self,
        world: int,
        args: Sequence[str],
        *,
        config: TrainConfig | None = None,
        env_override: dict[int, dict[str, str]] | None = None,
        cwd: Path = ROOT,
    ) -> Gang:
        """`python <args>` once per rank, each as a one-process pod of a `world`-node job."""
        port = free_port()
        gang = Gang()
        for rank in range(world):
            env = base_env()
            env.update(
                contract.rendezvous_env(
                    master_addr="127.0.0.1", master_port=port, nnodes=world, node_rank=rank, nproc_per_node=1
                )
            )
            if config is not None:
                env[CONFIG_ENV] = config.to_env_value()
            env.update((env_override or {}).get(rank, {}))
            gang.trees.append(spawn([PYTHON, *args], env, cwd))
        self.gangs.append(gang)
        return gang

    def torchrun(self, nproc: int, args: Sequence[str], *, config: TrainConfig | None = None) -> Gang:
        """One pod with `nproc` processes: a bare torchrun configured only by the PET_* mirror."""
        env = base_env()
        env.update(
            contract.rendezvous_env(
                master_addr="127.0.0.1", master_port=free_port(), nnodes=1, node_rank=0, nproc_per_node=nproc
            )
        )
        if config is not None:
            env[CONFIG_ENV] = config.to_env_value()
        gang = Gang([spawn([TORCHRUN, *args], env, ROOT)])
        self.gangs.append(gang)
        return gang

    def cleanup(self) -> None:
        for gang in self.gangs:
            gang.kill()


def digits_config(directory: Path, **training: Any) -> TrainConfig:
    spec = {"epochs": 6, "batchSize": 16, "learningRate": 0.004, "seed": 3, "logEverySteps": 10, **training}
    return TrainConfig.model_validate(
        {"backend": "gloo", "training": spec, "checkpoint": {"dir": str(directory), "keep": 2}}
    )
