"""pytorch/pytorch#56297 on demand: a gloo rank that deadlocks in `destroy_process_group()`.

    .venv/bin/python benchmarks/teardown_deadlock.py [--python VENV_PYTHON ...] [--teardowns destroy,...]
                                                     [--trials 10] [--timeout 60] [--load N] [--output FILE]

The deadlock (seen in the trainer image with torch 2.7.1, issue #22): the main thread drops the
last reference to the process group while it holds the GIL, so `~ProcessGroupGloo()` runs with
the GIL held and joins gloo's worker threads; a worker thread that still holds a collective's
work, and through it a tensor whose Python object was dropped while the collective was in
flight (torch keeps such a PyObject alive, owned by the tensor), must take the GIL to free that
PyObject when it lets the work go. Neither ever proceeds. pytorch/pytorch#154976 (torch 2.8)
releases the GIL in the destructor.

Each trial starts two plain processes (`--rank`, env:// on 127.0.0.1, no torchrun) with the
given interpreter. Each rank all-reduces a large tensor (`--mb` MiB) with `async_op=True`,
drops the tensor and the work at once, then leaves by one of these teardowns:
  destroy          `destroy_process_group()` at once, the collective still in flight: the
                   deadlock by construction on a torch that has it
  barrier-destroy  `barrier()`, then `destroy_process_group()`: the old trainer's `finish`, and
                   how a DDP script ends (its last all-reduce is complete when backward returns).
                   The collective is complete, but the gloo thread lets its work go a moment
                   later: a race, not a certainty
  barrier-exit     `barrier()`, then `os._exit(0)` after flushing: the built-in trainer's exit
                   since #22 (trainer/__main__.py `leave`); no destructor runs
A rank hangs when its teardown has not returned `--timeout` seconds after it dropped the
collective (it takes well under a second when it returns at all); a trial waits until each rank
has exited or hangs, at most `--limit` seconds (a rank still alive then for another reason is
"unfinished": under load, importing torch and leaving the interpreter take tens of seconds). Of
the first two trials with a live rank of each interpreter and teardown, py-spy (`py-spy dump
--native`) and gdb (`thread apply all bt`) stacks of the live ranks are saved into the result;
then every rank is killed by its PID.
`--python` takes interpreters of venvs holding the torch to test (default: this one), e.g.
/root/.cache/kubetrain/venv-torch-2.7.1/bin/python. Results: benchmarks/results/teardown_deadlock.json.

The rank side imports only the standard library and torch, so it runs in any venv.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from machine import report_head

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "benchmarks" / "results" / "teardown_deadlock.json"
TEARDOWNS = ("destroy", "barrier-destroy", "barrier-exit")
# What a rank prints on its way: the last one printed says where a hung rank stopped.
STAGES = ("initialised", "in-flight-dropped", "teardown-returned")
EVIDENCE_PER_VARIANT = 2  # hung trials whose stacks are saved, per interpreter and teardown


def rank_main(rank: int, teardown: str, mib: int) -> None:
    """One rank of a trial (MASTER_ADDR/MASTER_PORT/WORLD_SIZE from the env)."""
    import datetime

    import torch
    import torch.distributed as dist

    def stage(name: str) -> None:
        print(f"rank {rank}: {name} at {time.time():.3f}", flush=True)

    dist.init_process_group("gloo", rank=rank, timeout=datetime.timedelta(seconds=120))
    dist.all_reduce(torch.ones(4))  # the connections are up before the measured part
    stage(STAGES[0])
    tensor = torch.ones(mib * 2**20 // 4)
    work = dist.all_reduce(tensor, async_op=True)
    del tensor, work  # the collective goes on without a Python reference to either
    stage(STAGES[1])
    if teardown == "barrier-exit":
        dist.barrier()
        stage(STAGES[2])
        sys.stdout.flush()
        os._exit(0)
    if teardown == "barrier-destroy":
        dist.barrier()
    dist.destroy_process_group()
    stage(STAGES[2])


def stage_times(output: str) -> dict[str, float]:
    """stage -> the time a rank printed it."""
    times = {}
    for line in output.splitlines():
        _, _, rest = line.partition(": ")
        name, _, at = rest.partition(" at ")
        if name in STAGES:
            times[name] = float(at)
    return times


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def evidence(pid: int, python: str) -> dict[str, str]:
    """py-spy (Python and native frames of every thread) and gdb stacks of a live process."""
    found: dict[str, str] = {}
    spy = shutil.which("py-spy") or str(Path(python).parent / "py-spy")
    commands = {
        "py-spy": [spy, "dump", "--native", "--pid", str(pid)],
        "gdb": ["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt"],
    }
    for name, argv in commands.items():
        if shutil.which(argv[0]) is None and not Path(argv[0]).exists():
            found[name] = f"{argv[0]} not found"
            continue
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        found[name] = done.stdout + (f"\n[stderr]\n{done.stderr[-2000:]}" if done.returncode else "")
    return found


def torch_of(python: str) -> str:
    done = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print(m.version('torch'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def stuck(times: dict[str, float], now: float, timeout_s: float) -> bool:
    """Dropped its collective more than `timeout_s` ago and never returned from the teardown."""
    return STAGES[1] in times and STAGES[2] not in times and now - times[STAGES[1]] > timeout_s


def trial(
    python: str, teardown: str, mib: int, *, timeout_s: float, limit_s: float, evidence_too: bool
) -> dict[str, Any]:
    """Both ranks, until each has exited or is stuck in its teardown (or `limit_s` passed)."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2"}
    env["OMP_NUM_THREADS"] = "1"
    env.pop("PYTHONPATH", None)  # the interpreter's own torch, nothing of ours
    script = str(Path(__file__).resolve())
    with tempfile.TemporaryDirectory(prefix="teardown-deadlock-") as tmp:
        paths = [Path(tmp, f"rank-{rank}.log") for rank in range(2)]
        procs = []
        for rank, path in enumerate(paths):
            with path.open("w") as out:
                argv = [python, script, "--rank", str(rank), "--teardown", teardown, "--mb", str(mib)]
                procs.append(subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT))
        start = time.monotonic()
        while True:
            now = time.time()
            seen = [stage_times(path.read_text(errors="replace")) for path in paths]
            pending = [p.poll() is None and not stuck(t, now, timeout_s) for p, t in zip(procs, seen, strict=True)]
            if not any(pending) or time.monotonic() - start > limit_s:
                break
            time.sleep(0.1)
        wall = time.monotonic() - start
        alive = [rank for rank, p in enumerate(procs) if p.poll() is None]
        hung = [rank for rank in alive if stuck(seen[rank], now, timeout_s)]
        stacks = {f"rank {rank}": evidence(procs[rank].pid, python) for rank in alive} if evidence_too else {}
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait()
        outputs = [path.read_text(errors="replace") for path in paths]
    seen = [stage_times(out) for out in outputs]
    result: dict[str, Any] = {
        "hung": bool(hung),
        "hung_ranks": hung,  # alive, and stuck in the teardown for more than --timeout
        "unfinished_ranks": [rank for rank in alive if rank not in hung],  # alive elsewhere at --limit
        "exit_codes": [None if rank in alive else p.returncode for rank, p in enumerate(procs)],
        "last_stage": [max(times, key=times.__getitem__, default="none") for times in seen],
        # From dropping the in-flight collective to the teardown's return, per rank (None: never).
        "teardown_s": [
            round(t[STAGES[2]] - t[STAGES[1]], 3) if STAGES[1] in t and STAGES[2] in t else None for t in seen
        ],
        "wall_s": round(wall, 2),
    }
    if alive or any(code not in (0, None) for code in result["exit_codes"]):
        result["output_tails"] = [out[-3000:] for out in outputs]
    if stacks:
        result["stacks"] = stacks
    return result


def summarise(trials: list[dict[str, Any]]) -> dict[str, Any]:
    returned = sorted(s for t in trials for s in t["teardown_s"] if s is not None)
    return {
        "trials": len(trials),
        "hangs": sum(t["hung"] for t in trials),
        "hung_ranks": sum(len(t["hung_ranks"]) for t in trials),
        "unfinished": sum(bool(t["unfinished_ranks"]) for t in trials),
        "clean": sum(t["exit_codes"] == [0, 0] for t in trials),
        "other_failures": sum(
            not t["hung"] and not t["unfinished_ranks"] and t["exit_codes"] != [0, 0] for t in trials
        ),
        "teardown_s_max": returned[-1] if returned else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--python", action="append", help="interpreter of a venv with torch (repeatable)")
    parser.add_argument("--teardowns", default=",".join(TEARDOWNS), help="comma-separated (default: %(default)s)")
    parser.add_argument("--teardown", choices=TEARDOWNS, help=argparse.SUPPRESS)
    parser.add_argument("--trials", type=int, default=10, help="trials per interpreter and teardown")
    parser.add_argument(
        "--timeout", type=float, default=60, help="seconds a teardown may take before its rank counts as hung"
    )
    parser.add_argument("--limit", type=float, default=600, help="seconds a whole trial may take")
    parser.add_argument("--mb", type=int, default=64, help="MiB all-reduced in flight at teardown")
    parser.add_argument("--load", type=int, default=0, help="busy-loop processes during the trials (default: none)")
    parser.add_argument("--output", type=Path, default=RESULT, help="result JSON (default: %(default)s)")
    args = parser.parse_args()
    if args.rank is not None:
        rank_main(args.rank, args.teardown or "destroy", args.mb)
        return
    teardowns = [t.strip() for t in args.teardowns.split(",") if t.strip()]
    if bad := [t for t in teardowns if t not in TEARDOWNS]:
        raise SystemExit(f"--teardowns: unknown {bad} (known: {', '.join(TEARDOWNS)})")
    pythons = args.python or [sys.executable]
    load_before = os.getloadavg()
    start = time.monotonic()
    variants = []
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)]
    try:
        for python in pythons:
            torch_version = torch_of(python)
            for teardown in teardowns:
                trials = []
                for index in range(args.trials):
                    want = sum("stacks" in t for t in trials) < EVIDENCE_PER_VARIANT
                    result = trial(
                        python, teardown, args.mb, timeout_s=args.timeout, limit_s=args.limit, evidence_too=want
                    )
                    result["trial"] = index
                    result["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
                    trials.append(result)
                    brief = {k: v for k, v in result.items() if k not in ("stacks", "output_tails")}
                    print(json.dumps({"torch": torch_version, "teardown": teardown, **brief}), flush=True)
                variants.append(
                    {
                        "torch": torch_version,
                        "python": python,
                        "teardown": teardown,
                        "summary": summarise(trials),
                        "trials": trials,
                    }
                )
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    report = {
        **report_head("teardown_deadlock", load_before),
        "setup": {
            "trials": args.trials,
            "teardown_timeout_s": args.timeout,
            "trial_limit_s": args.limit,
            "mib": args.mb,
            "busy_loops": args.load,
        },
        "wall_s": round(time.monotonic() - start, 1),
        "summary": {f"torch {v['torch']} / {v['teardown']}": v["summary"] for v in variants},
        "variants": variants,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["summary"], indent=2))


if __name__ == "__main__":
    main()
