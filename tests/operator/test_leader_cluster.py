"""Two `kubetrain operator` processes on the real control plane, electing a leader on a Lease
(operator/leader.py) with the default timing, while 20 jobs arrive at once:

* the leader SIGKILLed in the middle of the burst: the standby takes over within the lease
  duration, and every job ends with exactly its pods (one per node, one creation each) and its
  Service;
* the leader stopped gracefully (SIGTERM, as a rolling update does): it gives the Lease back and
  the standby leads within 2 s;
* the leader paused (SIGSTOP) past its lease: the standby takes over, and the old leader, woken,
  writes nothing (the fence).
Each prints its figure (`-s` shows them; docs/operator-ha.md quotes them)."""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.controlplane import ControlPlane
from support.objects import Cluster, has_condition
from support.operator_process import OperatorProcess, assert_clean
from support.podlog import PodCreations
from support.waiting import wait_for

from kubetrain.api import naming
from kubetrain.operator.settings import DEFAULTS

pytestmark = pytest.mark.cluster

JOBS = 20
NODES = 3
LEASE = DEFAULTS.lease


class Pair:
    """Two operators on one Lease in the test's namespace; `first` is started first and leads."""

    def __init__(self, cp: ControlPlane, namespace: str, workdir: Path) -> None:
        flags = {"leader_elect": True, "leader_elect_resource_namespace": namespace}
        # One job creating its children at a time (default 8): the 20 jobs take long enough
        # that a leader can be stopped in the middle of them.
        flags |= {"workers": 1}
        self.first = OperatorProcess(cp.kubeconfig, workdir / "first.log", namespace, **flags)
        self.second = OperatorProcess(cp.kubeconfig, workdir / "second.log", namespace, **flags)

    def start(self) -> None:
        self.first.start()
        wait_for(self.first.leading, 30, "the first operator to lead")
        self.second.start()  # ready: its caches are listed
        assert not self.second.leading()
        assert writes(self.second) == 0, "a standby writes nothing"

    def stop(self) -> None:
        for proc in (self.first, self.second):
            proc.stop()


@pytest.fixture
def pair(crds_installed: ControlPlane, namespace: str, tmp_path: Path) -> Iterator[Pair]:
    operators = Pair(crds_installed, namespace, tmp_path)
    try:
        yield operators
    finally:
        operators.stop()


def writes(proc: OperatorProcess) -> float:
    """The operator's API writes so far (kubetrain_api_writes_total, all verbs)."""
    return sum(float(v) for v in re.findall(r"^kubetrain_api_writes_total\{[^}]*\} (\S+)$", proc.metrics(), re.M))


def burst(cluster: Cluster) -> list[str]:
    names = [f"burst-{i:02d}" for i in range(JOBS)]
    for name in names:
        cluster.create_job(name, nodes=NODES)
    return names


def mid_burst(created: PodCreations) -> None:
    """Return as soon as the watch shows the burst's first pods."""
    created.wait(NODES)


def was_mid_burst(stopped: OperatorProcess, successor: OperatorProcess) -> None:
    """The leader was stopped with jobs left: it did not create them all, its successor did."""
    done = stopped.log().count(" Created: created headless Service")
    assert done < JOBS, "the burst was over before the leader could be stopped in it"
    assert writes(successor) > 0
    print(f"the first leader created {done} of the {JOBS} jobs' children, the successor the rest")


def wait_leading(proc: OperatorProcess, since: float, timeout: float) -> float:
    """Seconds from `since` until `proc` reports leading (polled every 20 ms)."""
    wait_for(proc.leading, timeout, f"{proc.log_path.stem} to lead", interval=0.02)
    return time.monotonic() - since


def every_job_exact(cluster: Cluster, created: PodCreations, names: list[str]) -> None:
    """Each job: Created, attempt 0, no restart; exactly its pods (node-0..N-1, each created
    once) and one Service; nothing else in the namespace."""
    for name in names:
        job = cluster.wait_job(name, has_condition("Created"), "Created", timeout=60)
        assert job["status"]["attempt"] == 0 and job["status"]["restarts"] == 0, job["status"]
        pods = cluster.wait_pods(name, NODES, attempt=0)
        assert [p.metadata.name for p in pods] == [naming.pod_name(name, r) for r in range(NODES)]
        assert len(cluster.services(name)) == 1
        assert created.per_attempt(name) == {0: NODES}, f"{name}: pods created per attempt"
    everything = cluster.core.list_namespaced_pod(cluster.namespace).items
    assert len(everything) == JOBS * NODES, [p.metadata.name for p in everything]


def test_sigkill_of_the_leader_mid_burst_fails_over_within_the_lease(
    pair: Pair, cluster: Cluster, kube_api: Any
) -> None:
    pair.start()
    with PodCreations(kube_api, cluster.namespace) as created:
        names = burst(cluster)
        mid_burst(created)
        killed = time.monotonic()
        pair.first.kill()
        takeover = wait_leading(pair.second, killed, LEASE.duration + 10)
        every_job_exact(cluster, created, names)
        settled = time.monotonic() - killed
    print(f"\nSIGKILL mid-burst: takeover {takeover:.2f} s (lease {LEASE.duration:g} s), all settled {settled:.2f} s")
    assert takeover <= LEASE.duration + LEASE.retry_period
    was_mid_burst(pair.first, pair.second)
    pair.second.stop()
    assert_clean(pair.second.log())
    assert "Traceback" not in pair.first.log()


def test_graceful_stop_of_the_leader_mid_burst_hands_over_within_2_s(
    pair: Pair, cluster: Cluster, kube_api: Any
) -> None:
    pair.start()
    with PodCreations(kube_api, cluster.namespace) as created:
        names = burst(cluster)
        mid_burst(created)
        stopped = time.monotonic()
        pair.first.signal(signal.SIGTERM)
        handover = wait_leading(pair.second, stopped, 10)
        assert pair.first.proc is not None and pair.first.proc.wait(15) == 0
        every_job_exact(cluster, created, names)
        settled = time.monotonic() - stopped
    print(f"\nSIGTERM mid-burst: handover {handover:.2f} s, all settled {settled:.2f} s")
    # Released, not waited out: without the release the successor waits the lease's full duration
    # (15 s). The handover itself (0.2-2 s here) is printed above, not bounded: a loaded machine
    # stretches it, and the order it proves does not change.
    assert handover < LEASE.duration
    assert "released Lease" in pair.first.log()
    was_mid_burst(pair.first, pair.second)
    pair.second.stop()
    for proc in (pair.first, pair.second):
        assert_clean(proc.log())


def test_a_paused_leader_that_wakes_after_the_takeover_writes_nothing(
    pair: Pair, cluster: Cluster, kube_api: Any
) -> None:
    """SIGSTOP past the lease duration (a frozen VM, a long GC pause): the standby takes over
    and acts on what happened meanwhile; the old leader, resumed, finds its fence closed."""
    pair.start()
    cluster.create_job("held", nodes=NODES)
    cluster.wait_pods("held", NODES, attempt=0)
    with PodCreations(kube_api, cluster.namespace) as created:
        before = writes(pair.first)
        pair.first.signal(signal.SIGSTOP)
        paused = time.monotonic()
        cluster.core.delete_namespaced_pod(naming.pod_name("held", 1), cluster.namespace, grace_period_seconds=0)
        cluster.create_job("late", nodes=NODES)
        takeover = wait_leading(pair.second, paused, LEASE.duration + 10)
        cluster.wait_pods("held", NODES, attempt=1, timeout=60)
        cluster.wait_pods("late", NODES, attempt=0)
        pair.first.signal(signal.SIGCONT)
        wait_for(lambda: "stops leading" in pair.first.log(), 30, "the woken leader to step down")
        cluster.create_job("after", nodes=NODES)  # reconciled by the new leader only
        cluster.wait_pods("after", NODES, attempt=0)
        assert not pair.first.leading() and pair.second.leading()
        assert writes(pair.first) == before, "the old leader wrote after it woke"
        assert created.per_attempt("held") == {0: NODES, 1: NODES} and created.per_attempt("late") == {0: NODES}
    print(f"\nSIGSTOP of the leader: takeover {takeover:.2f} s after the pause")
    for proc in (pair.first, pair.second):
        proc.stop()
        assert_clean(proc.log())
