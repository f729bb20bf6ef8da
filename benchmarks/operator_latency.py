"""Operator latency on the real control plane: N jobs x M nodes created at once (8 threads).

Measures, per job, the time from its create request returning to a watch seeing the last of its
children (latency) and the last of its pods; the API writes per job, counted by the API server
itself (apiserver_request_total on pods, services, events and the job resource, minus the
benchmark's own job creations; other components' events can add a few); the operator's CPU
while the load ran and its resident memory.

    .venv/bin/python benchmarks/operator_latency.py [--jobs 50] [--nodes 4] [--repeat 3] [--peer kubeflow]

--peer kubeflow measures the Kubeflow Training Operator (tests/cluster/install.sh builds it)
beside kubetrain: in each round (a fresh control plane) kubetrain, Kubeflow as shipped (client
QPS 20, 1 worker) and Kubeflow tuned (QPS 1000, 32 workers) run one after another, each alone,
in a rotated order, on the same load: a PyTorchJob of Master 1 + Worker M-1. The summary gives
medians per operator and kubetrain's ratios to each Kubeflow configuration.

Before the burst each operator takes one warm-up job to its Created condition (recorded as
`warm_up_s`, left out of every other figure): the burst then meets an operator that is watching,
and a resource whose storage the API server has set up. Without it the start-up raced the burst:
an operator's health endpoint answers before its watches run (kubetrain first saw the jobs
0.8-0.95 s after they were created in 2 of 5 traced runs, at once in the others), and the API
server's first create of a custom resource took 2 s in 2 of 5, so p50 swung 0.4-1.8 s per round.

Writes benchmarks/results/operator_latency.json (every measurement, the summary). The machine is
shared: each measurement records the load average, and numbers only compare at similar load.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests")]

import measure  # noqa: E402
from peers import Peer, peers  # noqa: E402
from support.waiting import wait_for  # noqa: E402

PEERS = {"none": ["kubetrain"], "kubeflow": ["kubetrain", "kubeflow", "kubeflow-tuned"]}
WARM_UP = "warm-up"
COMPARED = ("p50_s", "p99_s", "all_children_s", "api_writes_per_job", "cpu_s_per_job", "rss_mib")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3, help="Rounds, each on a fresh control plane.")
    parser.add_argument("--peer", choices=sorted(PEERS), default="none", help="Measure Kubeflow beside kubetrain.")
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "operator_latency.json")
    args = parser.parse_args()
    if args.jobs < 1 or args.nodes < 1 or args.repeat < 1:
        parser.error("--jobs, --nodes and --repeat must be >= 1")
    names = PEERS[args.peer]
    runs: list[dict[str, Any]] = []
    for round_index in range(args.repeat):
        order = names[round_index % len(names) :] + names[: round_index % len(names)]
        runs += run_round(args, order, round_index)
    result = {"summary": summarize(runs), "runs": runs}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"], indent=2))
    return 0


def run_round(args: argparse.Namespace, order: list[str], round_index: int) -> list[dict[str, Any]]:
    """One control plane; each operator alone on its own namespace, in `order`."""
    round_peers = peers(order)
    with measure.control_plane(sorted({p.crds() for p in round_peers})) as cp:
        results = []
        for peer in round_peers:
            result = measure_one(cp, peer, args.jobs, args.nodes)
            results.append({"round": round_index, **result})
            print(f"round {round_index} {peer.name}: {json.dumps(result['latency_s'])}", flush=True)
        return results


def measure_one(cp: Any, peer: Peer, jobs: int, nodes: int) -> dict[str, Any]:
    ns = f"bench-{peer.name}"
    measure.namespace(cp, ns)
    log_path = cp.workdir / f"{peer.name}.log"
    names = [f"bench-{i:03d}" for i in range(jobs)]
    expected = peer.children_per_job(nodes)
    load_at_start = measure.machine()
    peer.start(cp, ns, log_path)
    try:
        with cp.api_client() as api, measure.ChildWatch(api, ns, peer.job_label) as children:
            warm_up = warm_up_s(api, peer, ns, nodes, children)
            before, cpu_before = measure.server_writes(cp), measure.cpu_seconds(peer.pid())
            started = time.perf_counter()
            created_at = measure.create_jobs(api, peer, ns, names, nodes)
            create_wall = time.perf_counter() - started
            children.wait(names, lambda _: expected, 60 + jobs * nodes * 0.5)
            settle(api, peer, ns)
            writes = measure.settled_writes(cp, before)
            cpu = measure.cpu_seconds(peer.pid()) - cpu_before
            rss = measure.rss_mib(peer.pid())
            seen = {name: children.children(name) for name in names}
            resumes = children.resumes
    finally:
        peer.stop()
    latencies = [max(seen[n].values()) - created_at[n] for n in names]
    to_pods = [max(t for c, t in seen[n].items() if c.startswith("Pod/")) - created_at[n] for n in names]
    to_first = [min(seen[n].values()) - created_at[n] for n in names]
    operator_writes = sum(writes.values()) - sum(v for k, v in writes.items() if k.startswith("POST ") and "jobs" in k)
    return {
        "operator": peer.name,
        "jobs": jobs,
        "nodes_per_job": nodes,
        "children_per_job": expected,
        "latency_s": {
            "p50": round(statistics.median(latencies), 4),
            "p99": round(measure.percentile(latencies, 0.99), 4),
            "max": round(max(latencies), 4),
            "min": round(min(latencies), 4),
            "definition": "create request returned -> last child (Services + pods) seen by a watch",
        },
        "to_last_pod_s": {
            "p50": round(statistics.median(to_pods), 4),
            "p99": round(measure.percentile(to_pods, 0.99), 4),
        },
        "to_first_child_s": {"p50": round(statistics.median(to_first), 4), "max": round(max(to_first), 4)},
        "all_children_created_after_s": round(max(max(s.values()) for s in seen.values()) - started, 3),
        "create_requests_wall_s": round(create_wall, 3),
        "warm_up_s": warm_up,
        "api_writes_per_job": round(operator_writes / jobs, 2),
        "api_writes_by_kind": writes,
        "operator_cpu_s": round(cpu, 2),
        "operator_cpu_s_per_job": round(cpu / jobs, 4),
        "operator_rss_mib": rss,
        "watch_resumes": resumes,
        "machine": {**load_at_start, "load_average_1m_at_end": measure.machine()["load_average_1m"]},
    }


def warm_up_s(api: Any, peer: Peer, ns: str, nodes: int, children: measure.ChildWatch) -> float:
    """One job through to its Created condition, before the measured burst: the seconds from
    its create request to its last child seen (the operator's start-up included)."""
    created_at = measure.create_jobs(api, peer, ns, [WARM_UP], nodes)[WARM_UP]
    children.wait([WARM_UP], lambda _: peer.children_per_job(nodes), 120)
    settle(api, peer, ns)
    return round(max(children.children(WARM_UP).values()) - created_at, 3)


def settle(api: Any, peer: Peer, ns: str) -> None:
    """Wait for every job's Created condition (both operators set one) so that the writes
    counted include the status writes that follow the children. Polls on the benchmark's one
    client: a new client per poll would add a TLS handshake to the API server's load each time."""
    from kubernetes import client

    (group, version, plural), _ = peer.job("x", 1)
    custom = client.CustomObjectsApi(api)

    def created() -> bool:
        listed = custom.list_namespaced_custom_object(group, version, ns, plural)
        return all(
            any(c["type"] == "Created" for c in (j.get("status") or {}).get("conditions") or [])
            for j in listed["items"]
        )

    wait_for(created, 120, f"every {plural[:-1]}'s Created condition")


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    by_operator: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(r["operator"] for r in runs):
        mine = [r for r in runs if r["operator"] == name]
        per_run = {
            "p50_s": [r["latency_s"]["p50"] for r in mine],
            "p99_s": [r["latency_s"]["p99"] for r in mine],
            "all_children_s": [r["all_children_created_after_s"] for r in mine],
            "api_writes_per_job": [r["api_writes_per_job"] for r in mine],
            "cpu_s_per_job": [r["operator_cpu_s_per_job"] for r in mine],
            "rss_mib": [r["operator_rss_mib"] for r in mine],
            "load_average_1m": [r["machine"]["load_average_1m"] for r in mine],
        }
        by_operator[name] = {
            "median": {k: round(statistics.median(v), 4) for k, v in per_run.items()},
            "per_run": per_run,
        }
    ratios = {
        f"kubetrain/{peer}": {
            k: round(by_operator["kubetrain"]["median"][k] / by_operator[peer]["median"][k], 3)
            for k in COMPARED
            if by_operator[peer]["median"][k]
        }
        for peer in by_operator
        if peer != "kubetrain" and "kubetrain" in by_operator
    }
    targets = {"vs kubeflow-tuned": {"p50_s": 0.8, "p99_s": 0.8, "cpu_s_per_job": 1.0, "api_writes_per_job": 0.5}}
    return {"by_operator": by_operator, "ratios": ratios, "targets": targets}


if __name__ == "__main__":
    raise SystemExit(main())
