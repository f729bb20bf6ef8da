"""The TrainingJobs the client submits (kubetrain.client.spec): submit()'s three inputs, and the
job train() builds around a shipped function. Pure: nothing is created."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.jobs import DIGITS_CPU, valid_job

from kubetrain.api import naming
from kubetrain.api.function import FUNCTION_DIR, FUNCTION_VOLUME, RUNNER_MODULE
from kubetrain.api.models import TrainingJob
from kubetrain.client import InvalidJob
from kubetrain.client.ship import ship
from kubetrain.client.spec import as_job, function_job, generated_name

pytestmark = pytest.mark.unit


def work(scale: float) -> None:
    print(scale)


def build(**options: Any) -> TrainingJob:
    defaults: dict[str, Any] = {"name": "work-abcde", "nodes": 2, "gpus_per_node": 0, "image": None, "env": None}
    return function_job(ship(work, (1.0,)), origin="m.work", **{**defaults, "spec": None, **options})


def test_submit_takes_a_model_a_dict_or_a_yaml_path(tmp_path: Path) -> None:
    document = valid_job("from-dict")
    assert as_job(document).name == "from-dict"
    assert as_job(TrainingJob.model_validate(document)).wire() == as_job(document).wire()
    assert as_job(str(DIGITS_CPU)).name == "digits-cpu"  # the PVC beside it is left out
    del document["apiVersion"], document["kind"]  # a Python dict may leave them out
    assert as_job(document).spec.nodes == 2


@pytest.mark.parametrize(
    ("job", "says"),
    [
        (valid_job(nodes=0), r"spec.nodes: Input should be greater than or equal to 1"),
        (valid_job(backend="nccl"), r"spec.backend: nccl needs GPUs"),
        (valid_job(env=[{"name": "RANK", "value": "1"}]), r"spec.env\[0\].name: .*'RANK' is reserved"),
        (valid_job(nodez=2), r"spec.nodez: unknown field"),
        ("/nonexistent/job.yaml", r"/nonexistent/job.yaml: No such file or directory"),
        (42, r"submit\(\) takes a TrainingJob, a dict or a YAML file path, not a int"),
    ],
)
def test_a_bad_job_names_the_field(job: Any, says: str) -> None:
    with pytest.raises(InvalidJob, match=says):
        as_job(job)


def test_a_function_job_runs_the_runner_on_the_shipped_configmap() -> None:
    job = build(env={"LR": "0.1"}, spec={"runPolicy": {"maxRestarts": 0}, "masterPort": 31000})
    wire = job.wire()
    assert wire["metadata"] == {"name": "work-abcde", "annotations": {"kubetrain.dev/function": "m.work"}}
    spec = wire["spec"]
    assert spec["command"] == ["torchrun", "-m", RUNNER_MODULE, FUNCTION_DIR]
    assert (spec["nodes"], spec["gpusPerNode"], spec["masterPort"]) == (2, 0, 31000)
    assert spec["runPolicy"]["maxRestarts"] == 0 and spec["env"] == [{"name": "LR", "value": "0.1"}]
    assert spec["template"]["spec"]["volumes"] == [
        {"name": FUNCTION_VOLUME, "configMap": {"name": "work-abcde-function"}}
    ]
    (trainer,) = spec["template"]["spec"]["containers"]
    assert trainer == {
        "name": "trainer",
        "volumeMounts": [{"name": FUNCTION_VOLUME, "mountPath": FUNCTION_DIR, "readOnly": True}],
    }


def test_a_template_of_ones_own_keeps_its_volumes_and_mounts() -> None:
    template = {
        "spec": {
            "volumes": [{"name": "data", "emptyDir": {}}],
            "containers": [{"name": "trainer", "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
        }
    }
    spec = build(spec={"template": template}).wire()["spec"]["template"]["spec"]
    assert [v["name"] for v in spec["volumes"]] == ["data", FUNCTION_VOLUME]
    assert [m["mountPath"] for m in spec["containers"][0]["volumeMounts"]] == ["/data", FUNCTION_DIR]


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"nodes": 0}, r"spec.nodes: Input should be greater than or equal to 1"),
        ({"gpus_per_node": -1}, r"spec.gpusPerNode: Input should be greater than or equal to 0"),
        ({"env": {"MASTER_ADDR": "x"}}, r"spec.env\[0\].name: 'MASTER_ADDR' is reserved"),
        ({"spec": {"command": ["python"]}}, r"spec.command: set by train\(\)"),
        ({"spec": {"nodes": 3}}, r"spec.nodes: set by nodes=, not through spec="),
        ({"spec": {"runPolicy": {"maxRestart": 0}}}, r"spec.runPolicy.maxRestart: unknown field"),
        ({"spec": {"template": []}}, r"spec.template: expected a mapping"),
        ({"name": "Bad_Name"}, r"metadata.name: String should match pattern"),
    ],
)
def test_a_bad_train_option_names_the_field(options: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidJob, match=says):
        build(**options)


@pytest.mark.parametrize(
    ("stem", "prefix"),
    [
        ("all_reduce_sum", "all-reduce-sum-"),
        ("_private", "private-"),
        ("2fast", "fn-2fast-"),
        ("x" * 80, "x" * (naming.MAX_JOB_NAME - 6) + "-"),  # cut so that the suffix fits
    ],
)
def test_generated_names_are_job_names(stem: str, prefix: str) -> None:
    name = generated_name(stem)
    assert name.startswith(prefix) and len(name) == len(prefix) + 5 <= naming.MAX_JOB_NAME
    TrainingJob.model_validate(valid_job(name))
