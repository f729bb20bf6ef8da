"""The client's kubernetes backend on the real control plane: the operator runs as
`kubetrain operator`, the process node runs the pods' containers as local processes (real
torchrun, real gloo) and serves their logs through the API server's `pods/log`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from support.controlplane import ControlPlane, free_port
from support.jobs import valid_job
from support.operator_process import OperatorProcess
from support.processnode import ProcessNode
from support.shipped import all_reduce_ranks, fails

from kubetrain.api import naming
from kubetrain.api.function import CALL_FILE, SOURCE_FILE, config_map_name
from kubetrain.api.models import TrainingJob
from kubetrain.client import AlreadyExists, Client, InvalidJob, JobFailed, JobNotFound, ShipError

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TIMEOUT = 240


@pytest.fixture
def client(crds_installed: ControlPlane, namespace: str) -> Client:
    return Client("kubernetes", namespace=namespace, kubeconfig=crds_installed.kubeconfig)


def kubetrain_logs(cp: ControlPlane, namespace: str, name: str) -> list[str]:
    kubetrain = Path(sys.executable).with_name("kubetrain")
    args = [str(kubetrain), "logs", name, "-n", namespace, "--kubeconfig", str(cp.kubeconfig)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, check=True)
    return done.stdout.splitlines()


def no_objects(kube_api: Any, namespace: str) -> bool:
    jobs = k8s.CustomObjectsApi(kube_api).list_namespaced_custom_object(
        naming.GROUP, naming.VERSION, namespace, naming.PLURAL
    )
    maps = k8s.CoreV1Api(kube_api).list_namespaced_config_map(namespace).items
    return not jobs["items"] and not [m for m in maps if m.metadata.name.endswith("-function")]


def test_a_function_on_two_nodes_succeeds_with_both_ranks_logs_and_rank0_metrics(
    client: Client, operator: OperatorProcess, process_node: ProcessNode, crds_installed: ControlPlane, kube_api: Any
) -> None:
    spec = {"masterPort": free_port(), "runPolicy": {"maxRestarts": 0}}  # the pods share this host's loopback
    job = client.train(all_reduce_ranks, nodes=2, args=(1,), spec=spec)
    shipped = k8s.CoreV1Api(kube_api).read_namespaced_config_map(config_map_name(job.name), client.namespace)
    (owner,) = shipped.metadata.owner_references
    assert (owner.kind, owner.name, owner.uid) == ("TrainingJob", job.name, job.get().metadata.uid)
    assert sorted(shipped.data) == [CALL_FILE, SOURCE_FILE] and "def all_reduce_ranks" in shipped.data[SOURCE_FILE]

    status = job.wait(timeout=TIMEOUT)
    assert status.phase == "Succeeded"
    lines = job.logs()
    assert "[node-0] rank 0 of 2: 1 -> sum 3" in lines and "[node-1] rank 1 of 2: 2 -> sum 3" in lines
    assert lines == kubetrain_logs(crds_installed, client.namespace, job.name)  # that command's own lines
    metrics = job.metrics()
    assert [(m["event"], m["step"], m["loss"]) for m in metrics] == [("step", s, 1.0 / s) for s in (1, 2, 3)]
    assert [j.name for j in client.list_jobs()] == [job.name]

    job.delete()
    with pytest.raises(JobNotFound, match=rf"trainingjob {job.name} in namespace {client.namespace}: .*not found"):
        job.status()


def test_a_trainingjob_model_reaches_succeeded(
    client: Client, operator: OperatorProcess, process_node: ProcessNode
) -> None:
    training = {"model": "mlp", "dataset": "synthetic", "syntheticSamples": 256, "epochs": 1, "batchSize": 32}
    model = TrainingJob.model_validate(valid_job("builtin", training=training, masterPort=free_port()))
    job = client.submit(model)
    assert job.wait(timeout=TIMEOUT).phase == "Succeeded"
    events = [record["event"] for record in job.metrics()]
    assert events[0] == "start" and "step" in events and events[-1] == "done"
    assert job.logs(rank=0) and all(line.startswith("[node-0] ") for line in job.logs(rank=0))
    with pytest.raises(AlreadyExists, match=r'trainingjobs.kubetrain.dev "builtin" already exists'):
        client.submit(model)


def test_a_failing_function_raises_from_wait_with_the_failure_in_status(
    client: Client, operator: OperatorProcess, process_node: ProcessNode
) -> None:
    spec = {"masterPort": free_port(), "runPolicy": {"maxRestarts": 0}}
    job = client.train(fails, nodes=2, args=("bad learning rate",), spec=spec)
    with pytest.raises(JobFailed, match=r"failed \(BackoffLimitExceeded\)") as raised:
        job.wait(timeout=TIMEOUT)
    status = raised.value.status
    assert status.phase == "Failed" and status.failures == job.status().failures
    (failure,) = status.failures or []
    # The pod's termination message: the end of its log, where torchrun names the root cause.
    assert failure.exit_code == 1 and "ValueError: bad learning rate" in failure.message


def test_what_cannot_be_shipped_or_is_invalid_creates_nothing(client: Client, kube_api: Any) -> None:
    with pytest.raises(ShipError, match=r"is a lambda"):
        client.train(lambda: None, nodes=2)
    with pytest.raises(InvalidJob, match=r"spec.nodes: Input should be greater than or equal to 1"):
        client.train(all_reduce_ranks, nodes=0, args=(1,))
    with pytest.raises(InvalidJob, match=r"spec.checkpoint.keep: Input should be greater than or equal to 1"):
        client.submit(valid_job(checkpoint={"keep": 0}))
    assert no_objects(kube_api, client.namespace)
    with pytest.raises(JobNotFound, match=r'trainingjobs.kubetrain.dev "nope" not found'):
        client.job("nope")
