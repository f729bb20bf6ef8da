"""Teardown under load: consecutive 2-node `kubetrain run --local` runs with every core busy.

    .venv/bin/python benchmarks/teardown_stress.py [--runs 12] [--load N] [--workloads builtin,nanogpt,...]
                                                   [--hooks on|off|alternate] [--output FILE] [--keep DIR]

A finished run must look finished: one attempt, every node exiting 0, and no crash text in
any node's log. Teardown races (a rank aborting at exit, torchrun's exit barrier losing its
store, a rank deadlocked in its process group's destructor) show up when the machine is
saturated, so `--load` busy-loop processes (default: one per core) run for the whole
benchmark and are killed by PID at the end.

Workloads (`--runs` runs of each, interleaved round-robin so the machine's noise falls on
all of them alike); every job has 2 nodes and maxRestarts 3, so a teardown crash shows as a
restart instead of a failed job, and every run starts in a fresh working directory:
  builtin    the default pod command (`torchrun -m kubetrain.trainer train`), a short digits job
  byo        benchmarks/plain_ddp.py under a bare torchrun (init_process_group from the env)
  multinode  pytorch/examples' ddp-tutorial-series `torchrun multinode.py 10 5`
  nanogpt    karpathy/nanoGPT `torchrun train.py --backend=gloo --device=cpu ...` (a tiny GPT,
             20 iterations, a checkpoint at 10 and 20) on random tokens written into data/random/
  kubeflow   Kubeflow training-operator v1.9.0's cpu-demo command `torchrun demo.py`
The last three are other people's scripts, vendored under benchmarks/third_party/ with only
their CUDA lines made CPU (its README lists every changed line): a fix that needs a user to
change their script would show here.

`--hooks off` (or `--no-hooks`) runs the same jobs without kubetrain's torchrun hooks
(runtime/torchrun_hooks.py): the runner's PYTHONPATH entry that loads them (local/site/) is
swapped for an empty folder, inside this benchmark only. `--hooks alternate` runs each job both
ways back to back (in turn hooks first and last), so that a comparison is not a comparison of two
stretches of the machine's load. Each run records which it got, read back from the run's own
local-rewrites.json, so a result cannot claim a mode it did not run.

Counted per run, from the run directory: outcome and reason, restarts (summary.json), node exit
codes, whether the script reached its end (its last log line), and in the node logs "terminate
called" (a C++ abort), "exit barrier" (torchrun's agent losing the store at its exit barrier)
and "Traceback". A run still going after --timeout is stopped (SIGTERM to `kubetrain run`, which
stops its nodes) after its live processes' stacks are dumped with py-spy, when it is on PATH.
Results go to benchmarks/results/teardown_stress.json (or --output).
"""

from __future__ import annotations

import argparse
import array
import contextlib
import json
import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml
from machine import report_head

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
KUBETRAIN = str(BIN / "kubetrain")
THIRD_PARTY = ROOT / "benchmarks" / "third_party"
RESULT = ROOT / "benchmarks" / "results" / "teardown_stress.json"
MARKERS = {"terminate_called": "terminate called", "exit_barrier": "exit barrier", "traceback": "Traceback"}
RUN_TIMEOUT_S = 600
STOP_GRACE_S = 60

# `kubetrain` with the runner's hook folder (kubetrain.local.localize.SITE_DIR) swapped for the
# empty folder given as the first argument: the nodes' PYTHONPATH then loads no sitecustomize.
WITHOUT_HOOKS = (
    "import sys; from pathlib import Path; import kubetrain.local.localize as localize; "
    "localize.SITE_DIR = Path(sys.argv.pop(1)); from kubetrain.cli import main; main()"
)

NANOGPT_ARGS = [
    "--dataset=random",
    "--backend=gloo",
    "--device=cpu",
    "--compile=False",
    "--dtype=float32",
    "--n_layer=2",
    "--n_head=2",
    "--n_embd=64",
    "--block_size=64",
    "--batch_size=8",
    "--gradient_accumulation_steps=2",
    "--max_iters=20",
    "--eval_interval=10",
    "--eval_iters=5",
    "--log_interval=5",
    "--warmup_iters=5",
    "--lr_decay_iters=20",
]
NANOGPT_VOCAB = 64


def nanogpt_data(workdir: Path) -> None:
    """nanoGPT's own layout (data/<dataset>/{train,val}.bin of uint16 tokens, meta.pkl with the
    vocabulary size), random tokens: the benchmark is about the exit, not the text."""
    data = workdir / "data" / "random"
    data.mkdir(parents=True)
    rng = random.Random(0)
    for split, tokens in (("train", 20_000), ("val", 4_000)):
        with (data / f"{split}.bin").open("wb") as out:
            array.array("H", (rng.randrange(NANOGPT_VOCAB) for _ in range(tokens))).tofile(out)
    with (data / "meta.pkl").open("wb") as out:
        pickle.dump({"vocab_size": NANOGPT_VOCAB}, out)


@dataclass(frozen=True)
class Workload:
    name: str
    spec: dict[str, Any]  # the TrainingJob's spec fields besides nodes, restarts and checkpoint
    # The line each node's log ends its work with: the script ran to its end before teardown.
    last_lines: tuple[str, str]
    sources: str | None = None  # a folder of benchmarks/third_party copied into the working directory
    prepare: Callable[[Path], None] | None = None
    files: tuple[str, ...] = field(default=())  # what the script must have written in the working directory


WORKLOADS = {
    w.name: w
    for w in (
        Workload(
            "builtin",
            {
                "training": {"dataset": "digits", "epochs": 2, "batchSize": 32, "logEverySteps": 5},
                "checkpoint": {"everySteps": 20},
            },
            ('{"event":"done"', ""),
        ),
        Workload(
            "byo",
            {"command": ["torchrun", str(ROOT / "benchmarks" / "plain_ddp.py")], "args": ["--steps", "60"]},
            ("step 60 loss", ""),
        ),
        Workload(
            "multinode",
            {"command": ["torchrun", "multinode.py", "10", "5"]},
            ("[GPU0] Epoch 9 |", "[GPU1] Epoch 9 |"),
            sources="pytorch_examples_multinode",
            files=("snapshot.pt",),
        ),
        Workload(
            "nanogpt",
            {"command": ["torchrun", "train.py"], "args": NANOGPT_ARGS},
            ("iter 20: loss", ""),
            sources="nanogpt",
            prepare=nanogpt_data,
            files=("out/ckpt.pt",),
        ),
        Workload(
            "kubeflow",
            {"command": ["torchrun", "demo.py"]},
            ("rank 0 world_size 2 result tensor([2])", "rank 1 world_size 2 result tensor([2])"),
            sources="kubeflow_cpu_demo",
        ),
    )
}


def job(workload: Workload) -> dict[str, Any]:
    """A short 2-node CPU TrainingJob; restarts allowed, so a teardown crash shows as a restart."""
    spec: dict[str, Any] = {
        "nodes": 2,
        "gpusPerNode": 0,
        "runPolicy": {"maxRestarts": 3},
        **{k: v for k, v in workload.spec.items() if k != "checkpoint"},
        "checkpoint": {"dir": "/checkpoints", **workload.spec.get("checkpoint", {})},
    }
    return {
        "apiVersion": "kubetrain.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": f"teardown-{workload.name}"},
        "spec": spec,
    }


@contextlib.contextmanager
def busy_load(processes: int) -> Iterator[list[int]]:
    """`processes` pure-Python busy loops; each is killed by its PID on the way out."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield [proc.pid for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def scan_logs(run_dir: Path, markers: Mapping[str, str] = MARKERS) -> dict[str, int]:
    """How many lines of all node logs contain each marker (by default: the crash markers)."""
    counts = dict.fromkeys(markers, 0)
    for log in sorted(run_dir.glob("node-*.log")):
        for line in log.read_text(errors="replace").splitlines():
            for key, text in markers.items():
                counts[key] += text in line
    return counts


def reached_end(workload: Workload, run_dir: Path, workdir: Path) -> bool:
    for rank, text in enumerate(workload.last_lines):
        log = run_dir / f"node-{rank}.log"
        if text and not (log.exists() and text in log.read_text(errors="replace")):
            return False
    return all((workdir / name).is_file() for name in workload.files)


def hooks_loaded(run_dir: Path) -> bool | None:
    """Whether node 0's PYTHONPATH began with a folder whose sitecustomize loads kubetrain's
    torchrun hooks (None: the run wrote no local-rewrites.json)."""
    rewrites = run_dir / "local-rewrites.json"
    if not rewrites.exists():
        return None
    node0 = json.loads(rewrites.read_text())["nodes"][0]
    first = node0["changed"].get("PYTHONPATH", {}).get("local", "").split(os.pathsep)[0]
    site = Path(first, "sitecustomize.py") if first else None
    return site is not None and site.is_file() and "torchrun_hooks" in site.read_text()


def dump_stacks(pid: int) -> dict[str, str]:
    """py-spy's view of every live Python process under `pid` (the evidence of a hang)."""
    spy = shutil.which("py-spy") or (str(BIN / "py-spy") if (BIN / "py-spy").exists() else None)
    if spy is None:
        return {"py-spy": "not on PATH: no stacks"}
    stacks = {}
    with contextlib.suppress(psutil.NoSuchProcess):
        for child in psutil.Process(pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                cmd = " ".join(child.cmdline())[:200]
                done = subprocess.run(
                    [spy, "dump", "--pid", str(child.pid)], capture_output=True, text=True, timeout=60, check=False
                )
                stacks[f"{child.pid} {cmd}"] = (done.stdout + done.stderr)[-6000:]
    return stacks


def run_kubetrain(argv: list[str], workdir: Path, timeout_s: float) -> tuple[int | None, str, dict[str, str]]:
    """(exit code or None on a timeout, stderr tail, stacks dumped on a timeout)."""
    env = {**os.environ, "PATH": os.pathsep.join([str(BIN), os.environ.get("PATH", "")])}
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(argv, cwd=workdir, env=env, stdout=subprocess.DEVNULL, stderr=err, text=True)
        stacks: dict[str, str] = {}
        try:
            code: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stacks = dump_stacks(proc.pid)
            proc.send_signal(signal.SIGTERM)  # the runner stops its nodes' process trees
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            code = None
        err.seek(0)
        return code, err.read()[-2000:], stacks


def one_run(index: int, workload: Workload, scratch: Path, *, hooks: bool, timeout_s: float) -> dict[str, Any]:
    job_file = scratch / f"{workload.name}.yaml"
    if not job_file.exists():
        job_file.write_text(yaml.safe_dump(job(workload)))
    run_dir = scratch / f"run-{index:03d}-{workload.name}"
    workdir = scratch / f"work-{index:03d}-{workload.name}"
    if workload.sources:
        shutil.copytree(THIRD_PARTY / workload.sources, workdir, ignore=shutil.ignore_patterns("LICENSE"))
    else:
        workdir.mkdir()
    if workload.prepare:
        workload.prepare(workdir)
    argv = [KUBETRAIN]
    if not hooks:
        empty = scratch / "no-hooks"
        empty.mkdir(exist_ok=True)
        argv = [sys.executable, "-c", WITHOUT_HOOKS, str(empty)]
    argv += ["run", str(job_file), "--local", "--run-dir", str(run_dir)]
    load = os.getloadavg()
    start = time.monotonic()
    code, stderr, stacks = run_kubetrain(argv, workdir, timeout_s)
    summary_file = run_dir / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.exists() else {}
    markers = scan_logs(run_dir)
    loaded = hooks_loaded(run_dir)
    if loaded is not None and loaded != hooks:
        raise SystemExit(f"run {index}: asked for hooks={hooks} but the nodes got hooks={loaded} ({run_dir})")
    result = {
        "run": index,
        "workload": workload.name,
        "hooks": loaded,
        "exit_code": code,
        "timed_out": code is None,
        "wall_s": round(time.monotonic() - start, 2),
        "load_average_at_start": [round(x, 2) for x in load],
        "outcome": summary.get("outcome"),
        "reason": summary.get("reason"),
        "restarts": summary.get("restarts"),
        "node_exit_codes": summary.get("nodeExitCodes"),
        "failures": summary.get("failures", []),
        "reached_end": reached_end(workload, run_dir, workdir),
        "markers": markers,
    }
    result["clean"] = (
        code == 0
        and summary.get("reason") == "AllNodesSucceeded"
        and summary.get("restarts") == 0
        and result["reached_end"]
        and not any(markers.values())
    )
    if not result["clean"]:
        result["log_tails"] = {log.name: log.read_text(errors="replace")[-4000:] for log in run_dir.glob("node-*.log")}
        result["stderr_tail"] = stderr
    if stacks:
        result["stacks_at_timeout"] = stacks
    return result


def totals(runs: list[dict[str, Any]]) -> dict[str, Any]:
    walls = sorted(r["wall_s"] for r in runs)
    return {
        "runs": len(runs),
        "clean_runs": sum(r["clean"] for r in runs),
        "succeeded": sum(r["outcome"] == "Succeeded" for r in runs),
        "succeeded_all_nodes": sum(r["reason"] == "AllNodesSucceeded" for r in runs),
        "reached_end": sum(r["reached_end"] for r in runs),
        "timed_out": sum(r["timed_out"] for r in runs),
        "restarts": sum(r["restarts"] or 0 for r in runs),
        "runs_with_restarts": sum(bool(r["restarts"]) for r in runs),
        "runs_with_crash_text": sum(any(r["markers"].values()) for r in runs),
        **{f"lines_{key}": sum(r["markers"][key] for r in runs) for key in MARKERS},
        "wall_s_median": walls[len(walls) // 2] if walls else None,
        "wall_s_max": walls[-1] if walls else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=12, help="runs of each workload (default: %(default)s)")
    parser.add_argument("--load", type=int, default=os.cpu_count() or 1, help="busy-loop processes (default: cores)")
    parser.add_argument(
        "--workloads", default=",".join(WORKLOADS), help="comma-separated, interleaved (default: %(default)s)"
    )
    parser.add_argument(
        "--hooks",
        choices=("on", "off", "alternate"),
        default="on",
        help="kubetrain's torchrun hooks on the nodes: on, off, or each job both ways (default: %(default)s)",
    )
    parser.add_argument("--no-hooks", dest="hooks", action="store_const", const="off", help="--hooks off")
    parser.add_argument("--timeout", type=float, default=RUN_TIMEOUT_S, help="seconds per run (default: %(default)s)")
    parser.add_argument("--output", type=Path, default=RESULT, help="result JSON (default: %(default)s)")
    parser.add_argument("--keep", type=Path, help="keep the run directories here (default: a temporary dir)")
    args = parser.parse_args()
    names = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [name for name in names if name not in WORKLOADS]
    if unknown or not names:
        raise SystemExit(f"--workloads: unknown workload(s) {unknown} (known: {', '.join(WORKLOADS)})")
    load_before = os.getloadavg()
    start = time.monotonic()
    runs = []
    with contextlib.ExitStack() as stack:
        scratch = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="teardown-stress-")))
        scratch.mkdir(parents=True, exist_ok=True)
        stack.enter_context(busy_load(args.load))
        for index, (name, hooks) in enumerate(schedule(names, args.runs, args.hooks)):
            result = one_run(index, WORKLOADS[name], scratch, hooks=hooks, timeout_s=args.timeout)
            runs.append(result)
            brief = {k: v for k, v in result.items() if k not in ("log_tails", "stderr_tail", "stacks_at_timeout")}
            print(json.dumps(brief), flush=True)
    report = {
        **report_head("teardown_stress", load_before, torch=_torch_version()),
        "setup": {
            "runs_per_workload": args.runs,
            "busy_loops": args.load,
            "workloads": names,
            "hooks": {"on": True, "off": False}.get(args.hooks, args.hooks),
            "timeout_s": args.timeout,
        },
        "wall_s": round(time.monotonic() - start, 1),
        "totals": totals(runs),
        "by_workload": {
            label(name, hooks, args.hooks): totals([r for r in runs if r["workload"] == name and r["hooks"] is hooks])
            for name in names
            for hooks in ((True, False) if args.hooks == "alternate" else (args.hooks == "on",))
        },
        "runs": runs,
    }
    write_report(args.output, report, "by_workload")


def schedule(names: list[str], runs: int, hooks: str) -> list[tuple[str, bool]]:
    """(workload, hooks) per run: the workloads interleaved; with `alternate` each one twice in a
    row, hooks first in every other round."""
    if hooks != "alternate":
        return [(name, hooks == "on") for _ in range(runs) for name in names]
    order = [(True, False), (False, True)]
    return [(name, on) for r in range(runs) for i, name in enumerate(names) for on in order[(r + i) % 2]]


def label(name: str, hooks: bool, mode: str) -> str:
    return name if mode != "alternate" else f"{name} ({'hooks' if hooks else 'no hooks'})"


def write_report(output: Path, report: dict[str, Any], shown: str) -> None:
    """The result JSON, and its `shown` part on stdout."""
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report[shown], indent=2))


def _torch_version() -> str:
    # Without importing torch here: the runs must not share this process's start-up cost.
    from importlib.metadata import version

    return version("torch")


if __name__ == "__main__":
    main()
