"""What a hot standby costs and what it buys (issue 26), on the real control plane:

  steady    a leader and a standby (leader election on a Lease) holding J jobs x N nodes: each
            process's CPU (% of one core) and resident memory over --steady-seconds, idle.
  sigkill   the leader SIGKILLed: seconds until the standby leads, and until a job created at
            the moment of the kill has all its pods (what a user waits for).
  sigterm   the leader stopped gracefully (what a rolling update does): the same two figures.

Each failover round promotes the standby and starts a fresh one beside it, so the rounds
alternate. The lease timing is the operator's default unless given.

    .venv/bin/python benchmarks/operator_failover.py [--jobs 50] [--nodes 4] [--steady-seconds 60]
        [--rounds 3] [--lease-duration S --renew-deadline S --retry-period S]

Writes benchmarks/results/operator_failover.json with the load average at the start and end:
numbers only compare at similar load.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests")]

import measure  # noqa: E402
from kubernetes import client  # noqa: E402
from peers import KubetrainPeer  # noqa: E402
from support.operator_process import OperatorProcess  # noqa: E402
from support.waiting import wait_for  # noqa: E402

from kubetrain.api import naming  # noqa: E402
from kubetrain.operator.settings import DEFAULTS  # noqa: E402

NAMESPACE = "failover"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--steady-seconds", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lease-duration", type=float, default=DEFAULTS.lease.duration)
    parser.add_argument("--renew-deadline", type=float, default=DEFAULTS.lease.renew_deadline)
    parser.add_argument("--retry-period", type=float, default=DEFAULTS.lease.retry_period)
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "operator_failover.json")
    args = parser.parse_args()
    if args.jobs < 1 or args.nodes < 1 or args.rounds < 1 or args.steady_seconds <= 0:
        parser.error("--jobs, --nodes and --rounds must be >= 1, --steady-seconds > 0")
    start = measure.machine()
    with measure.control_plane([ROOT / "crds"]) as cp, tempfile.TemporaryDirectory(prefix="failover-") as logs:
        measure.namespace(cp, NAMESPACE)
        with cp.api_client() as api:
            result = Failover(cp, api, Path(logs), args).run()
    result["machine"] = {**start, "load_average_1m_at_end": measure.machine()["load_average_1m"]}
    print(json.dumps(result, indent=2), flush=True)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    return 0


class Failover:
    def __init__(self, cp: Any, api: Any, logs: Path, args: argparse.Namespace) -> None:
        self.cp, self.api, self.logs, self.args = cp, api, logs, args
        self.core = client.CoreV1Api(api)
        self.peer = KubetrainPeer()
        self.started = 0

    def operator(self) -> OperatorProcess:
        self.started += 1
        flags = {
            "leader_elect": True,
            "leader_elect_resource_namespace": NAMESPACE,
            "leader_elect_lease_duration": self.args.lease_duration,
            "leader_elect_renew_deadline": self.args.renew_deadline,
            "leader_elect_retry_period": self.args.retry_period,
        }
        log = self.logs / f"operator-{self.started}.log"
        return OperatorProcess(self.cp.kubeconfig, log, NAMESPACE, **flags).start()

    def pods(self, job: str) -> int:
        return len(self.core.list_namespaced_pod(NAMESPACE, label_selector=f"{naming.LABEL_JOB}={job}").items)

    def run(self) -> dict[str, Any]:
        leader = self.operator()
        wait_for(leader.leading, 60, "the first operator to lead")
        standby = self.operator()
        names = [f"held-{i}" for i in range(self.args.jobs)]
        measure.create_jobs(self.api, self.peer, NAMESPACE, names, self.args.nodes)
        total = self.args.jobs * self.args.nodes
        wait_for(lambda: self.pods_all() >= total, 120 + total / 10, f"{total} pods")
        try:
            steady = self.steady(leader, standby)
            rounds = []
            for number in range(self.args.rounds):
                for how in ("sigkill", "sigterm"):
                    figures, leader, standby = self.failover(how, leader, standby, f"{how}-{number}")
                    rounds.append(figures)
                    print(json.dumps(figures), flush=True)
        finally:
            leader.stop()
            standby.stop()
        return {
            "jobs": self.args.jobs,
            "nodes": self.args.nodes,
            "lease": {
                "duration_s": self.args.lease_duration,
                "renew_deadline_s": self.args.renew_deadline,
                "retry_period_s": self.args.retry_period,
            },
            "steady": steady,
            "rounds": rounds,
            "summary": {
                how: {
                    key: {"max": max(values), "min": min(values)}
                    for key in ("takeover_s", "new_job_pods_s")
                    if (values := [r[key] for r in rounds if r["how"] == how])
                }
                for how in ("sigkill", "sigterm")
            },
        }

    def pods_all(self) -> int:
        return len(self.core.list_namespaced_pod(NAMESPACE, label_selector=naming.LABEL_JOB).items)

    def steady(self, leader: OperatorProcess, standby: OperatorProcess) -> dict[str, Any]:
        time.sleep(5)  # the burst's last status writes and events settle
        seconds = self.args.steady_seconds
        cpu = {name: measure.cpu_seconds(proc.pid) for name, proc in (("leader", leader), ("standby", standby))}
        time.sleep(seconds)  # the measurement window itself
        figures = {}
        for name, proc in (("leader", leader), ("standby", standby)):
            used = measure.cpu_seconds(proc.pid) - cpu[name]
            figures[name] = {"cpu_percent": round(100 * used / seconds, 2), "rss_mib": measure.rss_mib(proc.pid)}
        figures["window_s"] = seconds
        return figures

    def failover(
        self, how: str, leader: OperatorProcess, standby: OperatorProcess, job: str
    ) -> tuple[dict[str, Any], OperatorProcess, OperatorProcess]:
        """Stop the leader (`how`) while creating `job`; the standby must lead and create it."""
        stopped = time.monotonic()
        if how == "sigkill":
            leader.kill()
        else:
            leader.signal(signal.SIGTERM)
        measure.create_jobs(self.api, self.peer, NAMESPACE, [job], self.args.nodes)
        wait_for(standby.leading, self.args.lease_duration * 3, "the standby to lead", interval=0.02)
        takeover = time.monotonic() - stopped
        wait_for(lambda: self.pods(job) == self.args.nodes, 60, f"the pods of {job}", interval=0.02)
        pods = time.monotonic() - stopped
        leader.stop()  # reaps a SIGTERMed one (or waits for it)
        fresh = self.operator()
        return {"how": how, "takeover_s": round(takeover, 3), "new_job_pods_s": round(pods, 3)}, standby, fresh


if __name__ == "__main__":
    raise SystemExit(main())
