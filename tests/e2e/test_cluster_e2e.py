"""The end-to-end scenario: what a user does first, on a real cluster with our real images.

One body, two clusters (tests/support/providers.py, KUBETRAIN_E2E_PROVIDER): a real kubelet node
on this machine (`node`, default) or kind (`kind`, run by tests/e2e/kind-e2e.sh).

helm install the chart (a leader and a standby Ready; /metrics, /healthz and /readyz answer on
both, `kubetrain_leader` 1 on the Lease's holder only) -> a namespace that
enforces Pod Security `restricted` -> `kubectl apply -f examples/digits-cpu.yaml` -> Succeeded
with accuracy >= 0.9, progress and lastCheckpoint from rank 0's real log, printer columns and
Events -> a second, longer job whose node 1 pod is deleted mid-training: one gang restart,
resumed from the checkpoint on its volume, Succeeded -> `kubetrain logs` (all nodes, --rank,
-f across the attempt, --previous-attempt from the failed attempt's log archive) against the
real kubelet. A second test restarts the operator's Deployment (`kubectl rollout restart`) while
a third job trains: it goes on, same pods, no restart, Succeeded. Every step that fails prints
the operators' logs, the job's events, rank 0's log and the provider's own story
(support.diagnostics).

The chart is installed by support.release (its CPU knob: `--set resources.requests.cpu=0`).
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import release
from support.controlplane import Unavailable
from support.diagnostics import Diagnostics, deployment_log
from support.jobs import DIGITS_CPU
from support.providers import Provider, provider
from support.tools import ROOT, missing_tool
from support.waiting import wait_for

from kubetrain.api.records import records_in

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60 * 60)]

RELEASE, OPERATOR_NS, TRAINER_IMAGE = release.RELEASE, release.OPERATOR_NAMESPACE, release.TRAINER_IMAGE
JOB_NS = "e2e"
WAIT = "900s"  # per job: the machine is loaded, torch imports slowly
RESTART_EPOCHS = 100  # ~8x the example's steps (~4 min here): time to delete a pod mid-training
KUBETRAIN = Path(sys.executable).with_name("kubetrain")
PRIVILEGED = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "privileged", "namespace": JOB_NS},
    "spec": {"containers": [{"name": "c", "image": TRAINER_IMAGE, "securityContext": {"privileged": True}}]},
}


@pytest.fixture(scope="module")
def e2e_cluster() -> Iterator[Provider]:
    try:
        with provider() as running:
            yield running
    except Unavailable as missing:
        missing_tool(f"the end-to-end cluster is unavailable: {missing}")


class Scenario:
    """The scenario's state: its cluster, the diagnostics of a failed step, timings."""

    def __init__(self, cluster: Provider) -> None:
        self.cluster = cluster
        self.diagnose = Diagnostics(
            cluster.kubectl,
            JOB_NS,
            operator_log=deployment_log(cluster.kubectl, OPERATOR_NS, RELEASE),
            extra=cluster.describe_failure,
        )
        self.timings: dict[str, float] = {}
        self.peak_mib: dict[str, float] = {}

    def kubectl(self, *args: str, **options: Any) -> subprocess.CompletedProcess[str]:
        return self.cluster.kubectl(*args, **options)

    def job(self, name: str) -> dict[str, Any]:
        return json.loads(self.kubectl("get", "trainingjob", name, "-n", JOB_NS, "-o", "json").stdout)

    def records(self, pod: str) -> list[dict[str, Any]]:
        """The metrics records in a pod's log, parsed as the operator parses them."""
        got = self.kubectl("logs", "-n", JOB_NS, pod, "-c", "trainer", check=False)
        return records_in(got.stdout)

    def logs(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """`kubetrain logs` as a user runs it."""
        kubeconfig = [] if self.cluster.kubeconfig is None else ["--kubeconfig", str(self.cluster.kubeconfig)]
        return subprocess.run(
            [str(KUBETRAIN), "logs", *args, "-n", JOB_NS, *kubeconfig], capture_output=True, text=True, timeout=timeout
        )

    def sample_memory(self, stop: threading.Event) -> None:
        """Peak resident memory of each part, and of their sum, sampled every second."""
        while not stop.wait(1):
            try:
                now = self.cluster.memory_mib()
            except OSError:  # a process that ended between listing and reading
                continue
            for part, mib in {**now, "total": sum(now.values())}.items():
                self.peak_mib[part] = max(self.peak_mib.get(part, 0.0), mib)


def test_the_user_path_end_to_end(e2e_cluster: Provider, capsys: pytest.CaptureFixture[str]) -> None:
    run = Scenario(e2e_cluster)
    stop = threading.Event()
    threading.Thread(target=run.sample_memory, args=(stop,), name="memory", daemon=True).start()
    try:
        install_operator(run)
        train_the_example(run)
        restart_and_resume(run)
        for how in ("delete", "evict", "suspend"):
            no_step_lost(run, how)
    finally:
        stop.set()
        peak = {part: round(mib) for part, mib in run.peak_mib.items()}
        timings = {what: round(seconds, 1) for what, seconds in run.timings.items()}
        with capsys.disabled():  # the numbers the issue asks for, shown even when the test passes
            print(f"\nend-to-end on {e2e_cluster.name}: timings {json.dumps(timings)}; peak RSS MiB {json.dumps(peak)}")


def install_operator(run: Scenario) -> None:
    with run.diagnose.step("helm install, operator Ready", job="digits-cpu"):
        start = time.monotonic()
        release.install_operator(run.cluster)
        run.timings["helm install -> operator Ready s"] = time.monotonic() - start
    with run.diagnose.step("the operators' /metrics, /healthz and /readyz through the pod proxy", job="digits-cpu"):
        pods = run.kubectl(
            "get", "pods", "-n", OPERATOR_NS, "-l", f"app.kubernetes.io/instance={RELEASE}",
            "-o", "jsonpath={.items[*].metadata.name}",
        ).stdout.split()  # fmt: skip
        assert len(pods) == 2, pods  # the chart's default: a leader and a standby
        leader = wait_for(lambda: lease_holder(run), 60, "an operator to take the Lease")
        assert leader in pods, (leader, pods)
        for pod in pods:
            proxy = f"/api/v1/namespaces/{OPERATOR_NS}/pods/{pod}"
            metrics = run.kubectl("get", "--raw", f"{proxy}:8000/proxy/metrics").stdout
            assert f"kubetrain_leader {1.0 if pod == leader else 0.0}" in metrics, metrics[:2000]
            assert "kubetrain_reconcile_duration_seconds" in metrics, metrics[:2000]
            for probe in (":8080/proxy/healthz", ":8080/proxy/readyz"):
                assert run.kubectl("get", "--raw", proxy + probe).stdout.strip() == "ok", probe


def lease_holder(run: Scenario) -> str:
    """The pod holding the operator's Lease (its identity is `<pod name>_<random>`), or ""."""
    holder = run.kubectl(
        "get", "lease", RELEASE, "-n", OPERATOR_NS, "-o", "jsonpath={.spec.holderIdentity}", check=False
    ).stdout  # fmt: skip
    return holder.rpartition("_")[0]


def restricted_namespace(run: Scenario, *volumes: str) -> None:
    """The jobs' namespace enforces Pod Security `restricted`, and admission has seen it; a
    volume for each PVC in `volumes`."""
    namespace = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": JOB_NS, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}},
    }
    run.kubectl("apply", "-f", "-", input=json.dumps(namespace))

    def enforced() -> bool:
        got = run.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(PRIVILEGED), check=False)
        return got.returncode != 0 and "violates PodSecurity" in got.stderr

    wait_for(enforced, 60, "Pod Security admission enforcing restricted in the jobs' namespace", interval=1)
    for volume in volumes:
        run.cluster.volume(volume)


def train_the_example(run: Scenario) -> None:
    with run.diagnose.step("restricted namespace, kubectl apply -f examples/digits-cpu.yaml", job="digits-cpu"):
        restricted_namespace(run, "digits-cpu-checkpoints", "digits-restart-checkpoints")
        applied = time.time()
        run.kubectl("apply", "-n", JOB_NS, "-f", str(DIGITS_CPU))
    with run.diagnose.step("digits-cpu Succeeded", job="digits-cpu"):
        run.kubectl(
            "wait", "-n", JOB_NS, "--for=condition=Succeeded", "trainingjob/digits-cpu", f"--timeout={WAIT}",
            timeout=960,
        )  # fmt: skip
        run.timings["apply -> Succeeded s"] = time.time() - applied
    with run.diagnose.step("digits-cpu status, printer columns, Events, pod timings", job="digits-cpu"):
        check_finished_job(run, applied)
    with run.diagnose.step("kubetrain logs of digits-cpu against the real kubelet", job="digits-cpu"):
        # Every node's log was read (exit 0, nothing on stderr); only rank 0 prints records
        # (rank 1's log may well be empty), and its lines come first.
        every = run.logs("digits-cpu")
        assert (every.returncode, every.stderr) == (0, ""), every
        lines = every.stdout.splitlines()
        assert {line.split(" ", 1)[0] for line in lines} <= {"[node-0]", "[node-1]"}, lines[:20]
        assert any(line.startswith('[node-0] {"event":"done"') for line in lines), lines[-20:]
        assert lines[0].startswith("[node-0] "), lines[:5]
        node0 = [line for line in lines if line.startswith("[node-0] ")]
        last = run.logs("digits-cpu", "--rank", "0", "--tail", "3")
        assert (last.returncode, last.stdout.splitlines()) == (0, node0[-3:]), last
        one = run.logs("digits-cpu", "--rank", "1")
        assert (one.returncode, one.stderr) == (0, ""), one
        assert all(line.startswith("[node-1] ") for line in one.stdout.splitlines()), one.stdout
        none = run.logs("digits-cpu", "--previous-attempt")
        assert none.returncode == 1 and "has no failed attempt" in none.stderr, none


def check_finished_job(run: Scenario, applied: float) -> None:
    status = run.job("digits-cpu")["status"]
    progress, checkpoint = status["progress"], status["lastCheckpoint"]
    assert progress["accuracy"] >= 0.9, progress
    assert progress["step"] == progress["totalSteps"] > 0 and progress["percent"] == 100, progress
    assert checkpoint["path"].startswith("/checkpoints/") and 0 < checkpoint["step"] <= progress["step"], checkpoint
    assert status["restarts"] == 0, status
    records = run.records("digits-cpu-node-0")
    assert records[-1]["event"] == "done" and records[-1]["step"] == progress["step"], records[-3:]
    first_step = next(r for r in records if r["event"] == "step")
    run.timings["apply -> first training step s"] = first_step["time"] - applied
    table = run.kubectl("get", "tj", "-n", JOB_NS).stdout
    header = table.splitlines()[0].split()
    crd = yaml.safe_load((ROOT / "crds" / "trainingjobs.kubetrain.dev.yaml").read_text())
    columns = [
        c["name"].upper() for c in crd["spec"]["versions"][0]["additionalPrinterColumns"] if not c.get("priority")
    ]
    assert header == ["NAME", *columns], table
    assert "Succeeded" in table.splitlines()[1], table
    events = run.diagnose.events("digits-cpu")
    for reason in ("Normal Created TrainingJob/digits-cpu", "Normal Running TrainingJob/digits-cpu", "Scheduled Pod/"):
        assert reason in events, events
    for pod in ("digits-cpu-node-0", "digits-cpu-node-1"):
        doc = json.loads(run.kubectl("get", "pod", pod, "-n", JOB_NS, "-o", "json").stdout)
        started = doc["status"]["containerStatuses"][0]["state"]["terminated"]["startedAt"]
        run.timings[f"{pod} create -> Running s"] = _time(started) - _time(doc["metadata"]["creationTimestamp"])


def _time(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def longer_example(job: str) -> str:
    """digits-cpu renamed `job`, with RESTART_EPOCHS: time to act on it mid-training."""
    doc = DIGITS_CPU.read_text().replace("digits-cpu", job).replace("epochs: 12\n", f"epochs: {RESTART_EPOCHS}\n")
    assert f"epochs: {RESTART_EPOCHS}" in doc
    return doc


def restart_and_resume(run: Scenario) -> None:
    job = "digits-restart"
    doc = longer_example(job)
    with run.diagnose.step(f"{job}: a checkpoint, then node 1's pod deleted", job=job):
        run.kubectl("apply", "-n", JOB_NS, "-f", "-", input=doc)

        def checkpointed() -> int | None:
            saved = [r["step"] for r in run.records(f"{job}-node-0") if r["event"] == "checkpoint"]
            return saved[-1] if saved else None

        checkpoint = wait_for(checkpointed, 900, f"rank 0 of {job} writing a checkpoint", interval=1)
        assert run.job(job)["status"].get("phase") == "Running", "finished before it could be interrupted"
        run.kubectl("delete", "pod", f"{job}-node-1", "-n", JOB_NS, "--wait=false")
        deleted = time.time()
        wait_for(lambda: run.job(job)["status"].get("attempt", 0) >= 1, 300, f"{job} attempt >= 1", interval=1)
        check_previous_attempt(run.logs(job, "--previous-attempt"))
    with run.diagnose.step(f"{job}: kubetrain logs -f of the new attempt until its pods end", job=job):
        attempt1 = f"kubetrain.dev/job-name={job},kubetrain.dev/attempt=1"

        def both_created() -> bool:
            names = run.kubectl("get", "pods", "-n", JOB_NS, "-l", attempt1, "-o", "name", check=False).stdout
            return len(names.split()) == 2

        wait_for(both_created, 300, f"both pods of {job}'s attempt 1", interval=1)
        follow = run.logs(job, "-f", timeout=1200)
        run.timings["delete -> Succeeded s"] = time.time() - deleted
        assert follow.returncode == 0, follow.stderr
        for rank in (0, 1):
            ended = f"[attempt 1 node-{rank}] log ended: pod {job}-node-{rank} is Succeeded"
            assert ended in follow.stderr, follow.stderr
        node0 = "\n".join(line.removeprefix("[attempt 1 node-0] ") for line in follow.stdout.splitlines())
        resumed = [record for record in records_in(node0) if record["event"] == "resume"]
        assert resumed and resumed[0]["step"] > 0 and resumed[0]["step"] >= checkpoint, (resumed, checkpoint)
    with run.diagnose.step(f"{job} Succeeded after one gang restart", job=job):
        run.kubectl(
            "wait", "-n", JOB_NS, "--for=condition=Succeeded", f"trainingjob/{job}", "--timeout=120s", timeout=140
        )
        status = run.job(job)["status"]
        # A deleted pod is a disruption: its restart is counted apart from maxRestarts' budget.
        assert (status["uncountedRestarts"], status["restarts"], status["attempt"]) == (1, 0, 1), status
        assert status["failures"][0]["reason"] == "PodDeleted", status["failures"]
        assert status["progress"]["percent"] == 100, status["progress"]


def check_previous_attempt(previous: subprocess.CompletedProcess[str]) -> None:
    """Right after the gang restart the failed attempt's pods may still be terminating (their
    last lines are read from them) or gone (their tails from the attempt's log archive, the
    ConfigMap the operator wrote before it let them go): either way every node's last 50 lines,
    prefixed (rank 0's hold its records; rank 1's may be empty)."""
    assert (previous.returncode, previous.stderr) == (0, ""), previous
    lines = previous.stdout.splitlines()
    assert "[node-0]" in {line.split(" ", 1)[0] for line in lines} <= {"[node-0]", "[node-1]"}, previous
    assert len(lines) <= 2 * 50, "--previous-attempt shows the last 50 lines of each node"


def test_a_rolling_restart_of_the_operator_leaves_training_alone(
    e2e_cluster: Provider, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kubectl rollout restart` of the operator while a job trains (what `helm upgrade` does
    too): every operator pod is replaced, the Lease handed from pod to pod, and the job goes on
    with the same pods and no restart to Succeeded."""
    run = Scenario(e2e_cluster)
    job = "digits-rollout"
    install_operator(run)
    with run.diagnose.step(f"{job} training", job=job):
        restricted_namespace(run, f"{job}-checkpoints")
        run.kubectl("apply", "-n", JOB_NS, "-f", "-", input=longer_example(job))
        stepping = f"rank 0 of {job} training"
        wait_for(lambda: any(r["event"] == "step" for r in run.records(f"{job}-node-0")), 900, stepping, interval=1)
        before = pod_states(run, job)
        first_leader = lease_holder(run)
    with run.diagnose.step("kubectl rollout restart of the operator while the job trains", job=job):
        old_pods = set(operator_pods(run))
        with LeaseHistory(e2e_cluster) as history:
            started = time.monotonic()
            run.kubectl("rollout", "restart", f"deployment/{RELEASE}", "-n", OPERATOR_NS)
            run.kubectl(
                "rollout", "status", f"deployment/{RELEASE}", "-n", OPERATOR_NS, "--timeout=600s", timeout=620
            )  # fmt: skip
            rollout = time.monotonic() - started
            # `rollout status` returns once the new pods are available; the old ones may still be
            # terminating, and the last of them may still hold the Lease (a loaded CI run saw the
            # old leader's name here): the new leader is one of the new pods, once the old are gone.
            wait_for(lambda: not set(operator_pods(run)) & old_pods, 180, "the old operator pods gone", interval=1)
            new_leader = wait_for(
                lambda: (h := lease_holder(run)) in set(operator_pods(run)) - old_pods and h, 60, "a new pod leading"
            )
        assert new_leader != first_leader
        assert run.job(job)["status"].get("phase") == "Running", "the job finished before the rollout did"
    with run.diagnose.step(f"{job} Succeeded with the same pods and no restart", job=job):
        run.kubectl(
            "wait", "-n", JOB_NS, "--for=condition=Succeeded", f"trainingjob/{job}", f"--timeout={WAIT}", timeout=960
        )
        status = run.job(job)["status"]
        restarted = (status["restarts"], status.get("uncountedRestarts", 0), status["attempt"], status.get("failures"))
        assert restarted == (0, 0, 0, None), status
        after = pod_states(run, job)
        assert {pod: uid for pod, (uid, _) in after.items()} == {pod: uid for pod, (uid, _) in before.items()}
        assert all(restarts == 0 for _, restarts in after.values()), after
    with capsys.disabled():
        print(
            f"\nrollout restart of the operator mid-training on {e2e_cluster.name}: rollout {rollout:.1f} s, "
            f"leader changes {history.changes()}, longest leaderless handover {history.longest_gap():.2f} s; "
            f"{job} Succeeded, 0 restarts"
        )


def operator_pods(run: Scenario) -> list[str]:
    selector = f"app.kubernetes.io/instance={RELEASE}"
    names = run.kubectl("get", "pods", "-n", OPERATOR_NS, "-l", selector, "-o", "jsonpath={.items[*].metadata.name}")
    return names.stdout.split()


def pod_states(run: Scenario, job: str) -> dict[str, tuple[str, int]]:
    """Each pod of `job`: its uid and its container's restart count."""
    got = json.loads(
        run.kubectl("get", "pods", "-n", JOB_NS, "-l", f"kubetrain.dev/job-name={job}", "-o", "json").stdout
    )
    return {
        pod["metadata"]["name"]: (
            pod["metadata"]["uid"],
            sum(c.get("restartCount", 0) for c in pod["status"].get("containerStatuses") or []),
        )
        for pod in got["items"]
    }


class LeaseHistory:
    """Every version of the operator's Lease while it runs (a watch): how often the leader
    changed, and the longest time between a leader giving the Lease back and the next taking it."""

    def __init__(self, cluster: Provider) -> None:
        from kubernetes import config

        self.api = config.new_client_from_config(config_file=str(cluster.kubeconfig) if cluster.kubeconfig else None)
        self.specs: list[dict[str, Any]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="lease-history", daemon=True)

    def __enter__(self) -> LeaseHistory:
        self.thread.start()
        wait_for(lambda: self.specs, 30, "the Lease's first version")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)
        self.api.close()

    def _watch(self) -> None:
        from kubernetes import client, watch

        leases = client.CoordinationV1Api(self.api)
        while not self.stop.is_set():
            stream = watch.Watch().stream(
                leases.list_namespaced_lease, OPERATOR_NS, field_selector=f"metadata.name={RELEASE}", timeout_seconds=5
            )
            for event in stream:
                spec = event["object"].spec
                self.specs.append(
                    {"holder": spec.holder_identity or "", "acquired": spec.acquire_time, "renewed": spec.renew_time}
                )

    def changes(self) -> int:
        holders = [spec["holder"] for spec in self.specs if spec["holder"]]
        return sum(1 for a, b in itertools.pairwise(holders) if a != b)

    def longest_gap(self) -> float:
        gaps = [
            (taken["acquired"] - given["renewed"]).total_seconds()
            for given, taken in itertools.pairwise(self.specs)
            if not given["holder"] and taken["holder"]
        ]
        return max(gaps, default=0.0)


# --- no step lost to a disruption (#24) -------------------------------------------------------

# Periodic saves off (only epoch ends, every 22 steps): a step is saved at a stop only because
# the pod was asked to stop, and its checkpoint record says so (reason "signal", also when the
# stop lands on an epoch's last step). From step 30 rank 0 takes 1 s a step (KUBETRAIN_FAULT
# slow, once per job): the first attempt cannot finish before the disruption, by construction
# (400 s of steps are left). Where the stop lands depends on when the kubelet delivers the
# signal, which no test controls (seen: 13 s late), so nothing here depends on it: whatever the
# step, it is the one saved, the last one trained and the one the next attempt resumes.
STOP_AT_OR_AFTER = 31
HELD = "slow,rank=0,step=30,ms=1000"


def rank0_step(run: Scenario, job: str) -> int:
    """The last step rank 0 logged, read from its pod."""
    return max((r["step"] for r in run.records(f"{job}-node-0") if r["event"] == "step"), default=0)


def zero_loss_job(job: str) -> str:
    doc = yaml.safe_load_all(DIGITS_CPU.read_text().replace("digits-cpu", job))
    pvc, spec = (d for d in doc if d)
    spec["spec"]["training"].update(epochs=20, logEverySteps=1)
    spec["spec"]["checkpoint"]["everySteps"] = 1_000_000
    spec["spec"]["env"] = [{"name": "KUBETRAIN_FAULT", "value": HELD}]
    return yaml.safe_dump_all([pvc, spec])


def disrupt(run: Scenario, job: str, how: str) -> None:
    pod = f"{job}-node-1"
    if how == "delete":
        run.kubectl("delete", "pod", pod, "-n", JOB_NS, "--wait=false")
    elif how == "evict":
        eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": JOB_NS}}
        run.kubectl(
            "create", "--raw", f"/api/v1/namespaces/{JOB_NS}/pods/{pod}/eviction", "-f", "-", input=json.dumps(eviction)
        )
    else:  # suspend, then resume once every pod is gone
        patch = {"spec": {"runPolicy": {"suspend": True}}}
        run.kubectl("patch", "trainingjob", job, "-n", JOB_NS, "--type=merge", "-p", json.dumps(patch))
        selector = f"kubetrain.dev/job-name={job}"
        wait_for(
            lambda: not run.kubectl("get", "pods", "-n", JOB_NS, "-l", selector, "-o", "name").stdout.strip(),
            300,
            f"{job}'s pods gone while suspended",
            interval=1,
        )
        assert run.job(job)["status"]["phase"] == "Suspended"
        patch["spec"]["runPolicy"]["suspend"] = False
        run.kubectl("patch", "trainingjob", job, "-n", JOB_NS, "--type=merge", "-p", json.dumps(patch))


def no_step_lost(run: Scenario, how: str) -> None:
    """The pod of node 1 deleted, evicted, or the job suspended and resumed, mid-training: the
    next attempt starts at the last step the first one trained; a disruption is not counted."""
    job = f"zero-loss-{how}"
    run.cluster.volume(f"{job}-checkpoints")
    with run.diagnose.step(f"{job}: {how} mid-training", job=job):
        run.kubectl("apply", "-n", JOB_NS, "-f", "-", input=zero_loss_job(job))
        past = f"{job} past step {STOP_AT_OR_AFTER}"
        wait_for(lambda: rank0_step(run, job) >= STOP_AT_OR_AFTER, 600, past, interval=1)
        disrupt(run, job, how)
    with run.diagnose.step(f"{job}: Succeeded with no step lost", job=job):
        run.kubectl(
            "wait", "-n", JOB_NS, "--for=condition=Succeeded", f"trainingjob/{job}", f"--timeout={WAIT}", timeout=960
        )
        status = run.job(job)["status"]
        first = records_in(run.logs(job, "--attempt", "0", "--rank", "0").stdout.replace("[node-0] ", ""))
        second = records_in(run.logs(job, "--attempt", "1", "--rank", "0").stdout.replace("[node-0] ", ""))
        trained = max(r["step"] for r in first if r["event"] == "step")
        (saved,) = [r for r in first if r["event"] == "checkpoint" and r.get("reason") == "signal"]
        (resumed,) = [r for r in second if r["event"] == "resume"]
        assert saved["step"] == resumed["step"] == trained >= STOP_AT_OR_AFTER, (trained, saved, resumed)
        # The data position too: the first step the next attempt trains is the one after it.
        assert min(r["step"] for r in second if r["event"] == "step") == trained + 1, second[:5]
        uncounted = 0 if how == "suspend" else 1
        assert (status["restarts"], status.get("uncountedRestarts", 0), status["attempt"]) == (0, uncounted, 1), status
        assert status["progress"]["percent"] == 100, status["progress"]
