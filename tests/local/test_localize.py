"""The pods `--local` runs are the operator's rendered pods; only the rewrite table differs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from support.jobs import DIGITS_CPU, fake_job, write_job

from kubetrain.api.manifest import load
from kubetrain.api.training import CONFIG_ENV, TrainConfig
from kubetrain.local import plan as local
from kubetrain.local.localize import SITE_DIR
from kubetrain.local.view import header_lines
from kubetrain.operator import render

pytestmark = pytest.mark.unit


def rendered_env(pod: dict[str, object]) -> dict[str, str]:
    container = pod["spec"]["containers"][0]  # type: ignore[index]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}  # type: ignore[index]


def from_fields(pod: dict[str, object]) -> set[str]:
    """The env names a pod takes from its own fields or a Secret (`valueFrom`)."""
    container = pod["spec"]["containers"][0]  # type: ignore[index]
    return {e["name"] for e in container["env"] if "valueFrom" in e}  # type: ignore[index]


def test_only_the_rewrite_table_differs_from_the_rendered_pods(tmp_path: Path) -> None:
    plan = local.make_plan(DIGITS_CPU, run_dir=tmp_path / "run")
    job = load(DIGITS_CPU)
    pods = render.render_pods(job, "default", plan.uid, attempt=0)
    nodes = plan.nodes(attempt=0, master_port=41234)
    assert [n.argv for n in nodes] == [["torchrun", "-m", "kubetrain.trainer", "train"]] * 2
    for pod, node in zip(pods, nodes, strict=True):
        cluster = rendered_env(pod)
        fields = from_fields(pod)
        changed = {name for name, value in node.env.items() if cluster.get(name) != value and name not in fields}
        assert changed == {
            "MASTER_ADDR",
            "PET_MASTER_ADDR",
            "MASTER_PORT",
            "PET_MASTER_PORT",
            CONFIG_ENV,
            "KUBETRAIN_CHECKPOINT_DIR",
            "CUDA_VISIBLE_DEVICES",
            "OMP_NUM_THREADS",
            "PYTHONUNBUFFERED",
            "PYTHONPATH",
            "KUBETRAIN_ATTEMPT_FILE",
            "KUBETRAIN_AGENT_PORT",
        }
        assert set(node.rewritten) == changed
        # The in-place restart: the node's stand-in for its pod's attempt label file; no probe port.
        assert node.env["KUBETRAIN_ATTEMPT_FILE"] == str(plan.attempt_file(node.rank))
        assert cluster["KUBETRAIN_ATTEMPT_FILE"].startswith("/etc/kubetrain-pod/")
        assert node.env["KUBETRAIN_AGENT_PORT"] == ""
        # The pod's IP as its fieldRef reads it here; the operator's token (a Secret) has no use here.
        assert fields == {"KUBETRAIN_POD_IP", "KUBETRAIN_AGENT_TOKEN"}
        assert node.env["KUBETRAIN_POD_IP"] == "127.0.0.1" and "KUBETRAIN_AGENT_TOKEN" not in node.env
        assert node.env["MASTER_ADDR"] == node.env["PET_MASTER_ADDR"] == "127.0.0.1"
        assert node.env["MASTER_PORT"] == node.env["PET_MASTER_PORT"] == "41234"
        assert node.env["CUDA_VISIBLE_DEVICES"] == ""
        assert node.env["PYTHONPATH"].split(os.pathsep)[0] == str(SITE_DIR), "the torchrun hooks come first"
        config, cluster_config = (TrainConfig.model_validate_json(e[CONFIG_ENV]) for e in (node.env, cluster))
        local_dir = str((tmp_path / "run" / "checkpoints").resolve())
        assert config.checkpoint.dir == node.env["KUBETRAIN_CHECKPOINT_DIR"] == local_dir
        assert cluster["KUBETRAIN_CHECKPOINT_DIR"] == cluster_config.checkpoint.dir
        assert config.model_copy(update={"checkpoint": cluster_config.checkpoint}) == cluster_config


def test_inherited_contract_names_do_not_leak(tmp_path: Path) -> None:
    node = local.make_plan(DIGITS_CPU, run_dir=tmp_path).nodes(attempt=0, master_port=1)[1]
    env = node.full_env({"PATH": "/usr/bin", "RANK": "7", "LOCAL_RANK": "3", "KUBETRAIN_X": "1", "HOME": "/h"})
    assert env["RANK"] == "1" and env["LOCAL_RANK"] == "0"
    assert "KUBETRAIN_X" not in env and env["HOME"] == "/h"
    assert env["PATH"].split(":")[1:] == ["/usr/bin"]


def test_field_refs_are_emulated_and_secrets_refused(tmp_path: Path) -> None:
    job = fake_job("pass", env=[{"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}])
    nodes = local.make_plan(write_job(tmp_path, job), run_dir=tmp_path).nodes(attempt=0, master_port=1)
    assert [n.env["POD"] for n in nodes] == ["fake-node-0", "fake-node-1"]
    job["spec"]["env"] = [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]
    with pytest.raises(local.LocalRunError, match=r"spec\.env: TOKEN takes its value from secretKeyRef"):
        local.make_plan(write_job(tmp_path, job), run_dir=tmp_path)


AWS = {
    "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE",
    "AWS_SECRET_ACCESS_KEY": "secret",
    "AWS_SESSION_TOKEN": "token",
    "AWS_REGION": "eu-west-1",
    "AWS_PROFILE": "training",
    "AWS_SHARED_CREDENTIALS_FILE": "/home/me/.aws/credentials",
    "AWS_CONFIG_FILE": "/home/me/.aws/config",
}


def test_the_credentials_secret_is_this_environments_credentials(tmp_path: Path) -> None:
    store = {"url": "s3://bucket/runs/a", "credentialsSecret": "s3-keys"}
    job = fake_job("pass", checkpoint={"dir": "/staging", "objectStore": store})
    plan = local.make_plan(write_job(tmp_path, job), run_dir=tmp_path / "run")  # no Secret refused
    pod = plan.pods(attempt=0)[0]
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"} <= from_fields(pod)
    node = plan.nodes(attempt=0, master_port=1)[0]
    assert not any(name.startswith("AWS_") for name in node.env)
    assert {name: node.full_env({**AWS, "PATH": "/usr/bin"})[name] for name in AWS} == AWS
    assert not any(name.startswith("AWS_") for name in node.full_env({"PATH": "/usr/bin"})), "none where unset"
    # checkpoint.dir stays the run's own: the staging area, and metrics.jsonl for the plot.
    config = TrainConfig.model_validate_json(node.env[CONFIG_ENV])
    assert config.checkpoint.dir == str((tmp_path / "run" / "checkpoints").resolve())
    assert config.checkpoint.object_store is not None and config.checkpoint.object_store.url == store["url"]
    # The rewrite table says so at start, for the jobs it concerns.
    lines = header_lines(plan)
    assert any("checkpoint.objectStore.credentialsSecret (a Secret) -> the AWS_* credentials" in x for x in lines)
    other = local.make_plan(write_job(tmp_path, fake_job("pass")), run_dir=tmp_path / "other")
    assert not any("credentialsSecret" in x for x in header_lines(other))


@pytest.mark.parametrize(
    ("nodes", "per_node", "gpus", "expected"),
    [(2, 0, [], ["", ""]), (2, 2, ["0", "1", "2", "3"], ["0,1", "2,3"]), (1, 1, ["3", "5"], ["3"])],
)
def test_gpu_slices(nodes: int, per_node: int, gpus: list[str], expected: list[str], tmp_path: Path) -> None:
    job = fake_job("pass", nodes=nodes, gpusPerNode=per_node)
    assert local.device_slices(load(write_job(tmp_path, job)), gpus) == expected


def test_too_few_gpus_is_refused(tmp_path: Path) -> None:
    job = load(write_job(tmp_path, fake_job("pass", nodes=2, gpusPerNode=2)))
    with pytest.raises(local.LocalRunError, match=r"spec\.gpusPerNode: 2 nodes x 2 GPUs need 4 GPUs"):
        local.device_slices(job, ["0"])


def test_visible_gpus_from_env() -> None:
    assert local.visible_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}) == ["2", "3"]
    assert local.visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []


def test_run_files_record_the_rewrites(tmp_path: Path) -> None:
    plan = local.make_plan(DIGITS_CPU, run_dir=tmp_path / "run")
    local.write_run_files(plan, plan.nodes(attempt=0, master_port=5))
    described = json.loads((tmp_path / "run" / "local-rewrites.json").read_text())
    assert described["nodes"][1]["changed"]["MASTER_ADDR"] == {
        "rendered": "digits-cpu-node-0.digits-cpu.default.svc.cluster.local",
        "local": "127.0.0.1",
    }
    assert (tmp_path / "run" / "pods.yaml").read_text().count("kind: Pod") == 2
