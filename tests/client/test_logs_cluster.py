"""`kubetrain logs` against the real API server: the job, its pods and its log archives are real
objects (rendered by the operator's own render_pod and archive.configmap), the logs come
through the API server's `pods/log` from a stand-in kubelet (support.kubelet_logs). The
operator writing the archives is tested in tests/operator/test_archive_cluster.py; the real
kubelet's streams are read in the end-to-end scenario (tests/e2e/test_cluster_e2e.py)."""

from __future__ import annotations

import io
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from support.controlplane import ControlPlane
from support.jobs import valid_job
from support.kubelet import FakeKubelet
from support.kubelet_logs import KubeletLogs
from support.waiting import wait_for

from kubetrain.api import naming
from kubetrain.api.models import TrainingJob
from kubetrain.client.logs import Cluster, LogsError, attempt_logs, run_logs
from kubetrain.operator import archive
from kubetrain.operator.render import render_pod

pytestmark = pytest.mark.cluster
NOW = "2026-11-23T07:00:00Z"


class Job:
    """A TrainingJob whose pods this test creates and moves (no operator)."""

    def __init__(self, api: Any, namespace: str, name: str, kubelet: FakeKubelet, logs: KubeletLogs) -> None:
        self.api, self.namespace, self.name, self.kubelet, self.logs = api, namespace, name, kubelet, logs
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        doc = self.custom.create_namespaced_custom_object(
            naming.GROUP, naming.VERSION, namespace, naming.PLURAL, valid_job(name)
        )
        self.uid = doc["metadata"]["uid"]
        self.model = TrainingJob.model_validate(doc)

    def status(self, **status: Any) -> None:
        self.custom.patch_namespaced_custom_object_status(
            naming.GROUP, naming.VERSION, self.namespace, naming.PLURAL, self.name, {"status": status}
        )

    def pod(self, rank: int, attempt: int = 0, *, run: bool = True) -> str:
        body = render_pod(self.model, self.namespace, self.uid, rank, attempt)
        self.core.create_namespaced_pod(self.namespace, body)
        name = str(body["metadata"]["name"])
        if run:
            self.kubelet.run(self.namespace, name)
        return name

    def gone(self, pod: str) -> None:
        """Delete the pod and take kubetrain's finalizer off, as the operator does once it kept
        the pod's log; wait until it is gone."""
        self.core.delete_namespaced_pod(pod, self.namespace, grace_period_seconds=0)
        self.core.patch_namespaced_pod(pod, self.namespace, {"metadata": {"finalizers": None}})
        wait_for(
            lambda: not any(p.metadata.name == pod for p in self.core.list_namespaced_pod(self.namespace).items),
            30,
            f"{pod} gone",
        )

    def keep(self, attempt: int, logs: dict[int, str]) -> None:
        """The attempt's log archive, as the operator writes it."""
        body = archive.configmap(self.model, self.namespace, self.uid, attempt, archive.entries(logs, 2))
        self.core.create_namespaced_config_map(self.namespace, body)

    def read(self, **options: Any) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        options = {"rank": None, "previous": False, "follow": False, "tail": None, **options}
        code = run_logs(Cluster(self.api, self.namespace), self.name, out=out, err=err, poll=0.1, **options)
        return code, out.getvalue(), err.getvalue()


@pytest.fixture
def job(crds_installed: ControlPlane, kube_api: Any, namespace: str, tmp_path: Path) -> Iterator[Job]:
    kubelet = FakeKubelet(kube_api, node_name="kubetrain-log-node")
    with KubeletLogs(kubelet, tmp_path) as logs:
        yield Job(kube_api, namespace, "logs", kubelet, logs)


def test_every_node_prefixed_one_rank_and_tail(job: Job) -> None:
    for rank in (0, 1):
        name = job.pod(rank)
        for i in range(3):
            job.logs.write(name, f"line {i} of rank {rank}")
    code, out, err = job.read()
    assert (code, err) == (0, "")
    assert out.splitlines() == [f"[node-{r}] line {i} of rank {r}" for r in (0, 1) for i in range(3)]
    assert job.read(rank=1, tail=1) == (0, "[node-1] line 2 of rank 1\n", "")


def test_a_waiting_container_is_named_and_the_others_still_read(job: Job) -> None:
    job.logs.write(job.pod(0), "hello")
    name = job.pod(1, run=False)
    waiting = {"name": "trainer", "ready": False, "restartCount": 0, "image": "nope:1", "imageID": ""}
    waiting["state"] = {"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "nope:1"'}}
    job.kubelet.bind(job.namespace, name)
    job.kubelet.patch_status(job.namespace, name, {"phase": "Pending", "containerStatuses": [waiting]})
    code, out, err = job.read()
    assert (code, out) == (1, "[node-0] hello\n")
    assert (
        err == f'[node-1] pod {name}: container trainer is waiting: ImagePullBackOff: Back-off pulling image "nope:1"\n'
    )


def test_an_attempt_reads_its_pods_while_they_exist_then_its_archive(job: Job) -> None:
    failure = {"attempt": 0, "rank": 1, "reason": "Error", "exitCode": 3, "message": "exit code 3: boom"}
    job.status(attempt=1, restarts=1, failures=[failure])
    old = job.pod(1, attempt=0)
    job.logs.write(old, "boom from the pod")
    code, out, _ = job.read(previous=True, rank=1)
    assert (code, out) == (0, "[node-1] boom from the pod\n")
    job.gone(old)
    with pytest.raises(LogsError, match=r"attempt 0 has no pods left and no archived log .* recorded: Error on node 1"):
        job.read(previous=True)
    job.keep(0, {0: "saved step 41\n", 1: "Traceback (most recent call last):\nValueError: boom\n"})
    assert job.read(attempt=0) == (
        0,
        "[node-0] saved step 41\n[node-1] Traceback (most recent call last):\n[node-1] ValueError: boom\n",
        "",
    )
    assert job.read(previous=True, rank=1, tail=1) == (0, "[node-1] ValueError: boom\n", "")
    # The reusable read (kubetrain.client): where each log came from.
    read = attempt_logs(Cluster(job.api, job.namespace), "logs", attempt=0)
    assert read.sources == {0: "archive logs-attempt-0-logs", 1: "archive logs-attempt-0-logs"}


def test_an_archive_of_another_job_of_the_same_name_is_not_read(job: Job) -> None:
    job.status(attempt=1, restarts=1)
    other = archive.configmap(job.model, job.namespace, "another-uid", 0, {"node-0.log": "not yours\n"})
    job.core.create_namespaced_config_map(job.namespace, other)
    with pytest.raises(LogsError, match=r"no archived log .*; archived attempts: none"):
        job.read(attempt=0)


def test_follow_goes_on_with_the_next_attempt_and_names_it(job: Job) -> None:
    first = job.pod(0)
    job.logs.write(first, "attempt 0 trains")
    out, err = io.StringIO(), io.StringIO()
    codes: list[int] = []
    options = {"rank": 0, "previous": False, "follow": True, "tail": None, "out": out, "err": err, "poll": 0.1}
    reader = threading.Thread(target=lambda: codes.append(run_logs(Cluster(job.api, job.namespace), "logs", **options)))
    reader.start()
    job.kubelet.fail(job.namespace, first, exit_code=1)
    wait_for(lambda: "log ended" in err.getvalue(), 60, "-f saying how attempt 0's pod ended")
    # The gang restart: the status moves on, the old pod goes (its log kept), the new one runs.
    job.status(attempt=1, restarts=1)
    job.gone(first)
    job.logs.clear(first)
    job.logs.write(first, "attempt 1 resumes")
    job.pod(0, attempt=1)
    wait_for(lambda: "attempt 1 resumes" in out.getvalue(), 60, "-f following attempt 1")
    job.kubelet.succeed(job.namespace, first)
    done = {
        "type": "Succeeded",
        "status": "True",
        "reason": "AllNodesSucceeded",
        "lastTransitionTime": "2026-11-23T07:00:00Z",
    }
    job.status(attempt=1, restarts=1, conditions=[done])
    reader.join(90)
    assert codes == [0], err.getvalue()
    assert out.getvalue().splitlines() == [
        "[attempt 0 node-0] attempt 0 trains",
        "[attempt 1 node-0] attempt 1 resumes",
    ]
    assert err.getvalue().splitlines() == [
        "[attempt 0 node-0] log ended: pod logs-node-0 is Failed",
        "[attempt 1 node-0] log ended: pod logs-node-0 is Succeeded",
    ]


def test_follow_waits_for_a_pod_that_starts_later_and_says_how_each_ended(job: Job) -> None:
    job.logs.write(job.pod(0), "from rank 0")
    late = job.pod(1, run=False)
    result: list[tuple[int, str, str]] = []
    reader = threading.Thread(target=lambda: result.append(job.read(follow=True)))
    reader.start()
    # The stand-in kubelet serves what was written and closes the stream, so rank 0's stream
    # ends at once; rank 1's reader must still be waiting for its pod to start.
    job.logs.write(late, "from rank 1")
    job.kubelet.run(job.namespace, late)
    # A log stream ends when the container exits, a moment before its pod says so: `-f`
    # waits for the phase that tells how it ended.
    job.kubelet.succeed(job.namespace, "logs-node-0")
    job.kubelet.fail(job.namespace, late, exit_code=3)
    # Then -f waits for the next attempt, or for the job to finish.
    failed = {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "lastTransitionTime": NOW}
    job.status(conditions=[failed])
    reader.join(60)
    assert result, "kubetrain logs -f did not return after both streams ended and the job failed"
    code, out, err = result[0]
    assert code == 0
    assert sorted(out.splitlines()) == ["[attempt 0 node-0] from rank 0", "[attempt 0 node-1] from rank 1"]
    assert sorted(err.splitlines()) == [
        "[attempt 0 node-0] log ended: pod logs-node-0 is Succeeded",
        "[attempt 0 node-1] log ended: pod logs-node-1 is Failed",
    ]


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("nope", "trainingjob nope not found in namespace {ns}"),
        ("logs", "trainingjob logs in namespace {ns} has no pods"),
    ],
)
def test_the_command_says_what_is_missing(job: Job, crds_installed: ControlPlane, name: str, says: str) -> None:
    kubetrain = Path(sys.executable).with_name("kubetrain")
    args = [str(kubetrain), "logs", name, "-n", job.namespace, "--kubeconfig", str(crds_installed.kubeconfig)]
    result = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr.startswith("error: " + says.format(ns=job.namespace)), result.stderr
