"""Operator latency on the real control plane: N jobs x M nodes created at once.

Measures, per job, the time from its create request returning to the client seeing (through
a watch) the last of its children (headless Service + M pods); the API writes per job,
counted by the API server itself (apiserver_request_total on pods, services, events and
trainingjobs, minus the benchmark's own job creations; other components' events can add a
few) and by the operator's own kubetrain_api_writes_total; and the operator's resident memory.

    .venv/bin/python benchmarks/operator_latency.py [--jobs 50] [--nodes 4] [--repeat 3]

Writes benchmarks/results/operator_latency.json (every run, and a summary). The machine is
shared: each run records the load average, and numbers only compare at similar load. Needs
the binaries of tests/cluster/install.sh (the same control plane as the tests).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from support import controlplane  # noqa: E402
from support.operator_process import OperatorProcess  # noqa: E402
from support.waiting import wait_for  # noqa: E402

from kubetrain.api import naming  # noqa: E402

WRITE_VERBS = ("POST", "PUT", "PATCH", "DELETE")
RESOURCES = ("pods", "services", "events", "trainingjobs")


def server_writes(cp: Any) -> dict[str, float]:
    """apiserver_request_total for writes on the operator's resources, by verb/resource/subresource."""
    text = cp.kubectl("get", "--raw", "/metrics").stdout
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
        if labels.get("verb") in WRITE_VERBS and labels.get("resource") in RESOURCES:
            key = f"{labels['verb']} {labels['resource']}" + (
                f"/{labels['subresource']}" if labels.get("subresource") else ""
            )
            counts[key] = counts.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return counts


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3, help="Runs, each on a fresh control plane.")
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "operator_latency.json")
    args = parser.parse_args()
    runs = [run_once(args) for _ in range(args.repeat)]
    summary = {
        "p50_s_per_run": [r["latency_s"]["p50"] for r in runs],
        "p99_s_per_run": [r["latency_s"]["p99"] for r in runs],
        "api_writes_per_job_per_run": [r["api_writes_per_job"] for r in runs],
        "operator_writes_per_job_per_run": [r["operator_writes_per_job"] for r in runs],
        "operator_rss_mib_per_run": [r["operator_rss_mib"] for r in runs],
        "load_average_1m_per_run": [r["machine"]["load_average_1m_at_start"] for r in runs],
        "targets": {"p50_s": 0.5, "p99_s": 2.0, "writes_per_job": args.nodes + 3},
    }
    result = {"summary": summary, "runs": runs}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


def run_once(args: argparse.Namespace) -> dict[str, Any]:
    import psutil
    from kubernetes import client, watch

    load_at_start = round(os.getloadavg()[0], 2)
    workdir = Path(tempfile.mkdtemp(prefix="kubetrain-bench-"))
    cp = controlplane.start(workdir=workdir / "cp")
    proc: OperatorProcess | None = None
    try:
        cp.kubectl("apply", "--server-side", "-f", str(ROOT / "crds"))
        cp.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(ROOT / "crds"))
        api = cp.api_client()
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        namespace = "bench"
        core.create_namespace({"metadata": {"name": namespace}})

        def has_default_sa() -> bool:
            names = [sa.metadata.name for sa in core.list_namespaced_service_account(namespace).items]
            return "default" in names

        wait_for(has_default_sa, 30, "the default ServiceAccount")

        proc = OperatorProcess(cp.kubeconfig, workdir / "operator.log", namespaces=namespace).start()
        names = [f"bench-{i:03d}" for i in range(args.jobs)]
        expected = args.nodes + 1
        seen: dict[str, set[str]] = {name: set() for name in names}
        done_at: dict[str, float] = {}
        lock = threading.Lock()

        class RawWatch(watch.Watch):  # type: ignore[misc]
            # Plain dicts: deserializing every event into models would make this measuring
            # client compete with the operator for the same two cores.
            def get_return_type(self, func: Any) -> None:
                return None

        def watch_kind(list_fn: Any, kind: str) -> None:
            w = RawWatch()
            try:
                for event in w.stream(list_fn, namespace, label_selector=naming.LABEL_JOB, timeout_seconds=120):
                    if event["type"] == "ADDED":
                        record(w, kind, event["raw_object"])
            except Exception:  # the control plane stopping under an open watch
                return

        def record(w: Any, kind: str, obj: dict[str, Any]) -> None:
            job = obj["metadata"]["labels"][naming.LABEL_JOB]
            with lock:
                seen[job].add(f"{kind}/{obj['metadata']['name']}")
                if len(seen[job]) == expected and job not in done_at:
                    done_at[job] = time.perf_counter()
                    if len(done_at) == len(names):
                        w.stop()

        watchers = [
            threading.Thread(target=watch_kind, args=(fn, kind), daemon=True)
            for fn, kind in ((core.list_namespaced_pod, "Pod"), (core.list_namespaced_service, "Service"))
        ]
        for t in watchers:
            t.start()
        time.sleep(0.5)  # both watches established (they return nothing until an object exists)
        before = server_writes(cp)

        created_at: dict[str, float] = {}

        def create(name: str) -> None:
            body = {
                "apiVersion": naming.API_VERSION,
                "kind": naming.KIND,
                "metadata": {"name": name},
                "spec": {"nodes": args.nodes, "image": "kubetrain/trainer:bench"},
            }
            custom.create_namespaced_custom_object(naming.GROUP, naming.VERSION, namespace, naming.PLURAL, body)
            created_at[name] = time.perf_counter()

        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=16) as pool:
            list(pool.map(create, names))
        create_wall = time.perf_counter() - started
        wait_for(lambda: len(done_at) == len(names), 120, "every job's children", interval=0.05)
        all_done = max(done_at.values()) - started

        # Let the operator settle (status writes, events) before counting its writes.
        def settled() -> bool:
            jobs = custom.list_namespaced_custom_object(naming.GROUP, naming.VERSION, namespace, naming.PLURAL)
            return all(
                any(c["type"] == "Created" for c in (j.get("status") or {}).get("conditions") or [])
                for j in jobs["items"]
            )

        wait_for(settled, 60, "every job's Created condition")
        previous: dict[str, float] = {}
        current = server_writes(cp)
        while current != previous:  # stable across 2 s: nothing more in flight
            time.sleep(2)
            previous, current = current, server_writes(cp)
        writes = {k: current.get(k, 0.0) - before.get(k, 0.0) for k in current}
        writes = {k: v for k, v in writes.items() if v}
        operator_writes = sum(writes.values()) - writes.get("POST trainingjobs", 0.0)

        latencies = [done_at[n] - created_at[n] for n in names]
        assert proc.proc is not None
        operator_process = psutil.Process(proc.proc.pid)
        rss = operator_process.memory_info().rss
        cpu = operator_process.cpu_times()
        apiserver = psutil.Process(cp.processes["kube-apiserver"].pid).cpu_times()
        metric_lines = [
            line
            for line in proc.metrics().splitlines()
            if line.startswith(("kubetrain_api_writes_total", "kubetrain_reconcile_duration_seconds"))
        ]
        proc.stop()
        own_writes = sum(
            float(line.rsplit(" ", 1)[1]) for line in metric_lines if line.startswith("kubetrain_api_writes_total")
        )
        result: dict[str, Any] = {
            "jobs": args.jobs,
            "nodes_per_job": args.nodes,
            "latency_s": {
                "p50": round(statistics.median(latencies), 4),
                "p99": round(percentile(latencies, 0.99), 4),
                "max": round(max(latencies), 4),
                "min": round(min(latencies), 4),
                "definition": "create request returned -> last child (Service + pods) seen by a watch",
            },
            "all_children_created_after_s": round(all_done, 3),
            "create_requests_wall_s": round(create_wall, 3),
            "api_writes_per_job": round(operator_writes / args.jobs, 2),
            "operator_writes_per_job": round(own_writes / args.jobs, 2),
            "api_writes_target_per_job": args.nodes + 3,
            "api_writes_by_kind": writes,
            "operator_rss_mib": round(rss / 2**20, 1),
            "cpu_seconds_whole_run": {
                "operator": round(cpu.user + cpu.system, 2),
                "kube_apiserver": round(apiserver.user + apiserver.system, 2),
            },
            "operator_metrics": metric_lines,
            "machine": {
                "cpus": psutil.cpu_count(),
                "load_average_1m_at_start": load_at_start,
                "load_average_1m_at_end": round(os.getloadavg()[0], 2),
                "python": platform.python_version(),
            },
        }
        return result
    finally:
        if proc is not None:
            proc.stop()  # a run that failed midway must not leave the operator retrying forever
        cp.stop()


if __name__ == "__main__":
    raise SystemExit(main())
