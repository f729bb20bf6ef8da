"""kubetrain's operator at three scale points, on the real control plane (issue 15):

  wide     1 job x N nodes (default 256): create returned -> every pod and the Service seen by a
           watch, and the operator's CPU; against the floor measured in the same run, a bare
           client (8 threads, no decoding) creating the same N+1 objects (the operator's own,
           read back and renamed) in another namespace.
  held     J jobs x M nodes (default 1000 x 4) run to success (the benchmark plays the kubelet)
           and held, idle: the operator's RSS before, at half and at all jobs, and the growth
           per job between half and all (start-up and warm-up excluded).
  restart  a gang restart of a 64-node job: one pod deleted -> every pod of the next attempt
           seen by a watch.

    .venv/bin/python benchmarks/operator_scale.py [--scenario wide held restart] [--wide-nodes 256]
        [--held-jobs 1000] [--held-nodes 4] [--restart-nodes 64]

Each scenario runs on a fresh control plane. Writes benchmarks/results/operator_scale.json with
the load average at each scenario's start and end: numbers only compare at similar load.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests")]

import measure  # noqa: E402
from kubernetes import client  # noqa: E402
from peers import KubetrainPeer  # noqa: E402
from support.kubelet import FakeKubelet  # noqa: E402
from support.waiting import wait_for  # noqa: E402

from kubetrain.api import naming  # noqa: E402

SERVER_SET = ("uid", "resourceVersion", "creationTimestamp", "managedFields", "generation", "ownerReferences")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--scenario", nargs="+", choices=["wide", "held", "restart"], default=["wide", "held", "restart"]
    )
    parser.add_argument("--wide-nodes", type=int, default=256)
    parser.add_argument("--held-jobs", type=int, default=1000)
    parser.add_argument("--held-nodes", type=int, default=4)
    parser.add_argument("--restart-nodes", type=int, default=64)
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "operator_scale.json")
    args = parser.parse_args()
    if min(args.wide_nodes, args.held_nodes, args.restart_nodes) < 2 or args.held_jobs < 2:
        parser.error("--*-nodes and --held-jobs must be >= 2")
    scenarios = {"wide": wide, "held": held, "restart": restart}
    result: dict[str, Any] = {}
    for name in args.scenario:
        start = measure.machine()
        with measure.control_plane([ROOT / "crds"]) as cp:
            result[name] = scenarios[name](cp, args)
        result[name]["machine"] = {**start, "load_average_1m_at_end": measure.machine()["load_average_1m"]}
        print(f"{name}: {json.dumps(result[name])}", flush=True)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    return 0


def run_job(cp: Any, api: Any, peer: KubetrainPeer, ns: str, nodes: int) -> dict[str, Any]:
    """Create one job of `nodes` nodes; time until all its children are seen, operator CPU."""
    with measure.ChildWatch(api, ns, peer.job_label) as children:
        cpu_before = measure.cpu_seconds(peer.pid())
        created_at = measure.create_jobs(api, peer, ns, ["wide"], nodes)["wide"]
        children.wait(["wide"], lambda _: nodes + 1, 60 + nodes)
        seen = children.children("wide")
        return {
            "to_all_children_s": round(max(seen.values()) - created_at, 3),
            "to_first_child_s": round(min(seen.values()) - created_at, 3),
            "operator_cpu_s": round(measure.cpu_seconds(peer.pid()) - cpu_before, 2),
        }


def bare_client_floor(api: Any, source_ns: str, ns: str) -> dict[str, Any]:
    """Create copies of the operator's objects in `ns` as fast as a plain client does."""
    core = client.CoreV1Api(api)
    bodies: list[tuple[Any, dict[str, Any]]] = []
    for list_fn, create_fn in (
        (core.list_namespaced_service, core.create_namespaced_service),
        (core.list_namespaced_pod, core.create_namespaced_pod),
    ):
        for item in json.loads(list_fn(source_ns, _preload_content=False).data)["items"]:
            item.pop("status", None)
            for key in SERVER_SET:
                item["metadata"].pop(key, None)
            item["metadata"]["namespace"] = ns
            bodies.append((create_fn, item))
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda b: b[0](ns, b[1], _preload_content=False), bodies))
    return {"objects": len(bodies), "create_all_s": round(time.perf_counter() - started, 3), "threads": 8}


def wide(cp: Any, args: argparse.Namespace) -> dict[str, Any]:
    peer = KubetrainPeer()
    for ns in ("bench", "floor"):
        measure.namespace(cp, ns)
    peer.start(cp, "bench", cp.workdir / "operator.log")
    try:
        with cp.api_client() as api:
            operator = run_job(cp, api, peer, "bench", args.wide_nodes)
            rss = measure.rss_mib(peer.pid())
            floor = bare_client_floor(api, "bench", "floor")
    finally:
        peer.stop()
    ratio = round(operator["to_all_children_s"] / floor["create_all_s"], 3)
    return {
        "nodes": args.wide_nodes,
        "operator": {**operator, "rss_mib": rss},
        "floor": floor,
        "ratio_to_floor": ratio,
        "target_ratio": 1.5,
    }


def finish_all(api: Any, ns: str) -> None:
    """Play the kubelet: every pod in `ns` bound, then Succeeded with exit code 0."""
    kubelet = FakeKubelet(api)
    kubelet.ensure_node()
    names = [p.metadata.name for p in client.CoreV1Api(api).list_namespaced_pod(ns).items]
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda name: kubelet.succeed(ns, name), names))


def succeeded(api: Any, ns: str) -> int:
    custom = client.CustomObjectsApi(api)
    listed = json.loads(
        custom.list_namespaced_custom_object(
            naming.GROUP, naming.VERSION, ns, naming.PLURAL, _preload_content=False
        ).data
    )
    return sum(
        any(c["type"] == "Succeeded" and c["status"] == "True" for c in (j.get("status") or {}).get("conditions") or [])
        for j in listed["items"]
    )


def held(cp: Any, args: argparse.Namespace) -> dict[str, Any]:
    """RSS with J finished jobs held, created and finished in two halves."""
    peer, ns = KubetrainPeer(), "bench"
    measure.namespace(cp, ns)
    peer.start(cp, ns, cp.workdir / "operator.log")
    half = args.held_jobs // 2
    rss: dict[str, float] = {"start": measure.rss_mib(peer.pid())}
    started = time.perf_counter()
    try:
        with cp.api_client() as api:
            for label, names in (
                ("half", [f"held-{i:04d}" for i in range(half)]),
                ("all", [f"held-{i:04d}" for i in range(half, args.held_jobs)]),
            ):
                measure.create_jobs(api, peer, ns, names, args.held_nodes)
                total = half if label == "half" else args.held_jobs

                def all_pods(total: int = total) -> bool:
                    pods = client.CoreV1Api(api).list_namespaced_pod(ns, _preload_content=False)
                    return len(json.loads(pods.data)["items"]) >= total * args.held_nodes

                wait_for(all_pods, 60 + total, f"{total * args.held_nodes} pods")
                finish_all(api, ns)
                wait_for(
                    lambda total=total: succeeded(api, ns) >= total, 120 + total, f"{total} jobs Succeeded", interval=2
                )
                rss[label] = measure.rss_mib(peer.pid())
            cpu = measure.cpu_seconds(peer.pid())
    finally:
        peer.stop()
    growth = (rss["all"] - rss["half"]) / (args.held_jobs - half)
    return {
        "jobs": args.held_jobs,
        "nodes_per_job": args.held_nodes,
        "rss_mib": rss,
        "growth_mib_per_job": round(growth, 4),
        "targets": {"rss_mib": 250, "growth_mib_per_job": 0.1},
        "operator_cpu_s": round(cpu, 2),
        "wall_s": round(time.perf_counter() - started, 1),
    }


def restart(cp: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Delete one pod of a running N-node gang; time until the next attempt's N pods are seen."""
    peer, ns, nodes = KubetrainPeer(), "bench", args.restart_nodes
    measure.namespace(cp, ns)
    peer.start(cp, ns, cp.workdir / "operator.log")
    try:
        with cp.api_client() as api, measure.ChildWatch(api, ns, peer.job_label) as children:
            measure.create_jobs(api, peer, ns, ["gang"], nodes)
            children.wait(["gang"], lambda _: nodes + 1, 60 + nodes)
            cpu_before = measure.cpu_seconds(peer.pid())
            deleted_at = time.perf_counter()
            client.CoreV1Api(api).delete_namespaced_pod(naming.pod_name("gang", nodes // 2), ns)
            children.wait(["gang"], lambda _: 2 * nodes + 1, 60 + 2 * nodes)
            seen = sorted(children.children("gang").values())
            cpu = measure.cpu_seconds(peer.pid()) - cpu_before
    finally:
        peer.stop()
    return {
        "nodes": nodes,
        "delete_to_all_recreated_s": round(seen[-1] - deleted_at, 3),
        "delete_to_first_recreated_s": round(seen[nodes + 1] - deleted_at, 3),
        "operator_cpu_s": round(cpu, 2),
    }


if __name__ == "__main__":
    raise SystemExit(main())
