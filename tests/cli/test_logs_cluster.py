"""`kubetrain logs` against the real API server: the job and its pods are real objects (the
pods rendered by the operator's own render_pod), their logs come through the API server's
`pods/log` from a stand-in kubelet (support.kubelet_logs). The real kubelet's streams are
read in the end-to-end scenario (tests/e2e/test_cluster_e2e.py)."""

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
from kubetrain.cli.logs import Cluster, LogsError, run_logs
from kubetrain.operator.render import render_pod

pytestmark = pytest.mark.cluster


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


def test_previous_attempt_while_its_pods_exist_and_once_they_are_gone(job: Job) -> None:
    failure = {"attempt": 0, "rank": 1, "reason": "Error", "exitCode": 3, "message": "exit code 3: boom"}
    job.status(attempt=1, restarts=1, failures=[failure])
    old = job.pod(1, attempt=0)
    job.logs.write(old, "boom")
    code, out, _ = job.read(previous=True, rank=1)
    assert (code, out) == (0, "[node-1] boom\n")
    job.core.delete_namespaced_pod(old, job.namespace, grace_period_seconds=0)
    wait_for(lambda: not job.core.list_namespaced_pod(job.namespace).items, 30, "the old pod gone")
    with pytest.raises(LogsError, match=r"failed attempt 0 are gone .* recorded: Error on node 1: exit code 3: boom"):
        job.read(previous=True)


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
    reader.join(60)
    assert result, "kubetrain logs -f did not return after both streams ended"
    code, out, err = result[0]
    assert code == 0
    assert sorted(out.splitlines()) == ["[node-0] from rank 0", "[node-1] from rank 1"]
    assert sorted(err.splitlines()) == [
        "[node-0] log ended: pod logs-node-0 is Succeeded",
        "[node-1] log ended: pod logs-node-1 is Failed",
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
