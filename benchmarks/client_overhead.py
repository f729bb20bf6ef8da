"""What kubetrain.client costs a user: its own work per `Job.wait()` poll, and the time from
`train()` to the first training step locally against `kubetrain run --local` of the same job.

Per poll: `Job.wait()` reads the status (locally status.json, on a cluster one GET of the
TrainingJob), validates it with the API's models and redraws the bar. Timed here exactly so
(`job.status()` then the terminal bar's update, drawn into a buffer), against a job that is
running and publishing progress: wall time and this thread's CPU time per poll, and the CPU
share of the poll interval. `--cluster` adds the kubernetes backend on a fresh control plane
(the tests' binaries) against a TrainingJob whose status carries progress and conditions.

Startup: each repeat runs, interleaved and alternating which goes first, (a) `client.train(fn,
nodes=2)` and (b) `kubetrain run job.yaml --local --volume kubetrain-function=DIR`, where
job.yaml is the very TrainingJob train() builds and DIR holds the same shipped files: the same
processes, so the difference is the client's own start (shipping, in-process planning) against
the command's (a Python start and its imports). `fn` takes one DDP optimizer step and logs it;
the time is from the call (or the command's launch) to that record's own `time`.

    .venv/bin/python benchmarks/client_overhead.py [--repeats 5] [--polls 200] [--cluster] [--output FILE]

Writes benchmarks/results/client_overhead.json (or --output).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml

from kubetrain.api.function import FUNCTION_VOLUME
from kubetrain.api.records import records_in
from kubetrain.client import Client, Job
from kubetrain.client.localrun import LocalBackend
from kubetrain.client.progress import TerminalBar
from kubetrain.client.ship import ship
from kubetrain.client.spec import function_files, function_job, generated_name
from kubetrain.trainer import lib

ROOT = Path(__file__).resolve().parent.parent
KUBETRAIN = str(Path(sys.executable).parent / "kubetrain")
RESULTS = ROOT / "benchmarks" / "results" / "client_overhead.json"
TIMEOUT_S = 300


def one_step(features: int) -> None:
    """One DDP optimizer step, logged as rank 0's first `step` record."""
    ctx = lib.context()
    model = lib.DDP(torch.nn.Linear(features, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(torch.ones(8, features)).pow(2).mean()
    loss.backward()
    optimizer.step()
    lib.log0(ctx, "step", step=1, epoch=0, total_steps=1, loss=loss.item())


def stats(values: list[float], digits: int = 3) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "median": round(statistics.median(ordered), digits),
        "p95": round(ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))], digits),
        "min": round(ordered[0], digits),
        "max": round(ordered[-1], digits),
    }


# --- per poll -------------------------------------------------------------------------------------


def time_polls(job: Job, polls: int, interval_s: float) -> dict[str, Any]:
    """What one iteration of wait()'s loop costs, without its sleep."""
    bar = TerminalBar(io.StringIO(), force_terminal=True)
    walls, cpus = [], []
    try:
        for _ in range(polls):
            wall, cpu = time.perf_counter(), time.thread_time()
            bar.update(job.name, job.status())
            cpus.append((time.thread_time() - cpu) * 1000)
            walls.append((time.perf_counter() - wall) * 1000)
    finally:
        bar.close()
    return {
        "polls": polls,
        "poll_interval_s": interval_s,
        "wall_ms": stats(walls),
        "cpu_ms": stats(cpus),
        "cpu_share_of_interval": round(statistics.median(cpus) / 1000 / interval_s, 5),
    }


RECORDS_SCRIPT = textwrap.dedent(
    """
    import json, os, time
    for step in range(1, 100000):
        if os.environ["NODE_RANK"] == "0":
            record = {"event": "step", "time": time.time(), "step": step, "epoch": 0, "total_steps": 100000,
                      "loss": 1.0 / step, "samples_per_s": 1000.0}
            print(json.dumps(record), flush=True)
        time.sleep(0.1)
    """
)


def local_polls(root: Path, polls: int) -> dict[str, Any]:
    """Polls of a running local job whose rank 0 publishes progress (no torch: a small script)."""
    client = Client("local", run_dir=root)
    job = client.submit(
        {"metadata": {"name": "polled"}, "spec": {"nodes": 2, "command": [sys.executable, "-c", RECORDS_SCRIPT]}}
    )
    try:
        deadline = time.monotonic() + 60
        while (job.status().progress is None or job.status().phase != "Running") and time.monotonic() < deadline:
            time.sleep(0.2)
        return time_polls(job, polls, LocalBackend.poll_s)
    finally:
        job.delete()


def cluster_polls(polls: int) -> dict[str, Any]:
    """Polls of a TrainingJob on a fresh control plane, its status as the operator writes one."""
    sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests")]
    import measure  # the benchmarks' control plane (tests/support)
    from kubernetes import client as k8s
    from support.jobs import training_job

    from kubetrain.api import naming
    from kubetrain.client.kube import KubernetesBackend

    with measure.control_plane([ROOT / "crds"]) as cp:
        measure.namespace(cp, "polls")
        body = training_job()  # examples/digits-cpu.yaml
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        status = {
            "phase": "Running",
            "attempt": 0,
            "conditions": [
                {"type": t, "status": "True", "reason": r, "message": "", "lastTransitionTime": now}
                for t, r in (("Created", "PodsCreated"), ("Running", "AllPodsRunning"))
            ],
            "progress": {"epoch": 3, "step": 120, "totalSteps": 264, "percent": 45, "loss": 0.23, "updatedAt": now},
            "replicas": {"active": 2, "ready": 2},
        }
        with cp.api_client() as api:
            custom = k8s.CustomObjectsApi(api)
            custom.create_namespaced_custom_object(naming.GROUP, naming.VERSION, "polls", naming.PLURAL, body)
            custom.patch_namespaced_custom_object_status(
                naming.GROUP, naming.VERSION, "polls", naming.PLURAL, "digits-cpu", {"status": status}
            )
        client = Client("kubernetes", namespace="polls", kubeconfig=cp.kubeconfig)
        return time_polls(client.job("digits-cpu"), polls, KubernetesBackend.poll_s)


# --- train() to the first step --------------------------------------------------------------------


def first_step_time(log: Path, alive: Callable[[], bool]) -> float:
    """The `time` of rank 0's first step record in `log` (the node's own clock at the step)."""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline and alive():
        if log.exists():
            steps = [r for r in records_in(log.read_text(errors="replace")) if r["event"] == "step"]
            if steps:
                return float(steps[0]["time"])
        time.sleep(0.01)
    raise RuntimeError(f"no step record in {log} within {TIMEOUT_S} s")


def by_client(root: Path) -> dict[str, float]:
    client = Client("local", run_dir=root)
    started = time.time()
    job = client.train(one_step, nodes=2, args=(16,))
    returned = time.time()
    try:
        step = first_step_time(root / job.name / "node-0.log", lambda: True)
        job.wait(timeout=TIMEOUT_S, progress=False)
    finally:
        job.delete()
    return {"call_returned_s": returned - started, "to_first_step_s": step - started}


def by_command(work: Path) -> dict[str, float]:
    """The same TrainingJob and shipped files, run by `kubetrain run --local`."""
    name = generated_name("one-step")
    shipment = ship(one_step, (16,))
    files = work / f"{name}-function"
    files.mkdir()
    for file, text in function_files(shipment).items():
        (files / file).write_text(text)
    job = function_job(
        shipment, name=name, origin="one_step", nodes=2, gpus_per_node=0, image=None, env=None, spec=None
    )
    job_file = work / f"{name}.yaml"
    job_file.write_text(yaml.safe_dump(job.wire(), sort_keys=False))
    run_dir = work / name
    command = [KUBETRAIN, "run", str(job_file), "--local", "--run-dir", str(run_dir)]
    started = time.time()
    proc = subprocess.Popen(
        [*command, "--volume", f"{FUNCTION_VOLUME}={files}"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        step = first_step_time(run_dir / "node-0.log", lambda: proc.poll() is None)
        code = proc.wait(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    if code != 0:
        raise RuntimeError(f"kubetrain run exited {code}: {proc.stderr.read().decode() if proc.stderr else ''}")
    return {"to_first_step_s": step - started}


def startup(repeats: int) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kubetrain-client-bench-") as tmp:
        for repeat in range(repeats):
            work = Path(tmp) / f"repeat-{repeat}"
            work.mkdir()
            order = ("client", "command") if repeat % 2 == 0 else ("command", "client")
            row: dict[str, Any] = {"order": list(order)}
            for method in order:
                row[method] = by_client(work / "runs") if method == "client" else by_command(work)
            row["ratio"] = row["client"]["to_first_step_s"] / row["command"]["to_first_step_s"]
            rows.append(row)
            print(f"repeat {repeat}: {json.dumps(row)}", flush=True)
    if not rows:
        return {"repeats": 0}
    return {
        "repeats": repeats,
        "client_to_first_step_s": stats([r["client"]["to_first_step_s"] for r in rows], 2),
        "command_to_first_step_s": stats([r["command"]["to_first_step_s"] for r in rows], 2),
        "client_call_returned_s": stats([r["client"]["call_returned_s"] for r in rows], 3),
        "ratio_client_to_command": stats([r["ratio"] for r in rows], 3),
        "runs": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="startup pairs (0: none)")
    parser.add_argument("--polls", type=int, default=200)
    parser.add_argument("--cluster", action="store_true", help="also time the kubernetes backend's polls")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="kubetrain-client-polls-") as tmp:
        polls: dict[str, Any] = {"local": local_polls(Path(tmp), args.polls)}
    if args.cluster:
        polls["kubernetes"] = cluster_polls(args.polls)
    print(f"polls: {json.dumps(polls)}", flush=True)
    result: dict[str, Any] = {
        "benchmark": "kubetrain.client: its cost per wait() poll; train() -> first step against kubetrain run --local",
        "per_poll": polls,
        "startup": startup(args.repeats),
        "machine": {
            "cpus": os.cpu_count(),
            "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
            "python": platform.python_version(),
            "torch": torch.__version__,
        },
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    summary = {key: value for key, value in result["startup"].items() if key.endswith(("_s", "command"))}
    print(json.dumps({"per_poll": polls, "startup": summary}))


if __name__ == "__main__":
    main()
