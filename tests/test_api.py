"""The TrainingJob models: the examples are valid, every invalid case names its field."""

from __future__ import annotations

from pathlib import Path

import pytest
from cases import INVALID_JOBS
from support.jobs import BASE_JOB, valid_job

from kubetrain.api import manifest, naming
from kubetrain.api.contract import RESERVED_ENV
from kubetrain.api.models import TrainingJob
from kubetrain.api.training import TrainConfig

pytestmark = pytest.mark.unit

EXAMPLES = sorted((Path(__file__).parent.parent / "examples").glob("*.yaml"))


def test_there_are_examples_for_cpu_gpu_and_byo() -> None:
    jobs = [manifest.load(path) for path in EXAMPLES]
    assert any(job.spec.gpus_per_node == 0 and job.spec.command is None for job in jobs)
    assert any(job.spec.gpus_per_node == 4 and job.spec.nodes == 2 for job in jobs)
    assert any(job.spec.command is not None for job in jobs)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_valid(path: Path) -> None:
    manifest.load(path)  # raises InvalidTrainingJob, naming the field


def test_invalid_table_is_large_enough() -> None:
    assert len(INVALID_JOBS) >= 25
    assert len({case_id for case_id, _, _ in INVALID_JOBS}) == len(INVALID_JOBS)


@pytest.mark.parametrize(("case_id", "document", "field"), INVALID_JOBS, ids=[c[0] for c in INVALID_JOBS])
def test_invalid_jobs_are_rejected_naming_the_field(case_id: str, document: dict, field: str) -> None:
    with pytest.raises(manifest.InvalidTrainingJob) as error:
        manifest.parse(document, case_id)
    lines = str(error.value).splitlines()[1:]
    assert any(line.strip().startswith(f"{field}:") or line.strip().startswith(f"{field}[") for line in lines), (
        f"expected an error naming {field}, got:\n{error.value}"
    )


def test_defaults_are_filled_and_round_trip() -> None:
    job = TrainingJob.model_validate(valid_job())
    assert job.spec.master_port == 29500
    assert job.spec.run_policy.clean_pod_policy == "Running"
    assert job.spec.checkpoint.dir == "/checkpoints"
    again = TrainingJob.model_validate(job.wire())
    assert again == job


def test_trainer_config_travels_through_the_env_value() -> None:
    job = TrainingJob.model_validate(valid_job())
    config = job.spec.trainer_config()
    parsed = TrainConfig.from_env({"KUBETRAIN_CONFIG": config.to_env_value()})
    assert parsed == config
    assert parsed.checkpoint.every_steps == BASE_JOB["spec"]["checkpoint"]["everySteps"]


STORE = {"url": "s3://bucket/runs/a", "endpoint": "http://minio:9000", "credentialsSecret": "s3-keys"}


@pytest.mark.parametrize(
    "volume", [None, {"persistentVolumeClaim": {"claimName": "staging"}}], ids=["no-volume", "volume"]
)
def test_the_trainer_gets_the_object_store_without_the_clusters_credentials(volume: dict | None) -> None:
    checkpoint = {"everySteps": 10, "objectStore": STORE, **({"volume": volume} if volume else {})}
    job = manifest.parse(valid_job(checkpoint=checkpoint))  # no volume needed: dir is the staging area
    assert job.spec.checkpoint.object_store is not None
    assert job.spec.checkpoint.object_store.credentials_secret == "s3-keys"
    wire = job.spec.trainer_config().wire()["checkpoint"]
    assert wire["objectStore"] == {"url": "s3://bucket/runs/a", "endpoint": "http://minio:9000"}
    assert "volume" not in wire
    assert "s3-keys" not in job.spec.trainer_config().to_env_value()


def test_credentials_in_env_and_in_a_secret_are_refused_naming_both() -> None:
    checkpoint = {"objectStore": STORE}
    env = [{"name": "FOO", "value": "1"}, {"name": "AWS_ACCESS_KEY_ID", "value": "AKIA"}]
    with pytest.raises(manifest.InvalidTrainingJob) as error:
        manifest.parse(valid_job(checkpoint=checkpoint, env=env))
    assert "spec.env[1].name: AWS_ACCESS_KEY_ID comes from checkpoint.objectStore.credentialsSecret" in str(error.value)
    # Without the Secret the job's env may carry them (the pods' own credentials).
    manifest.parse(valid_job(checkpoint={"objectStore": {"url": STORE["url"]}}, env=env))


def test_fingerprint_ignores_logging_but_not_the_model() -> None:
    base = TrainConfig()
    chatty = TrainConfig.model_validate({"training": {"logEverySteps": 1}})
    wider = TrainConfig.model_validate({"training": {"hiddenSize": 256}})
    assert base.fingerprint() == chatty.fingerprint()
    assert base.fingerprint() != wider.fingerprint()


def test_name_limit_leaves_room_for_the_largest_rank() -> None:
    longest = "j" * naming.MAX_JOB_NAME
    assert len(naming.pod_name(longest, naming.MAX_NODES - 1)) == naming.MAX_DNS_LABEL
    TrainingJob.model_validate(valid_job(name=longest))


@pytest.mark.parametrize("name", sorted(RESERVED_ENV))
def test_every_reserved_name_is_rejected(name: str) -> None:
    with pytest.raises(manifest.InvalidTrainingJob, match="reserved"):
        manifest.parse(valid_job(env=[{"name": name, "value": "1"}]))


def test_a_file_may_carry_a_pvc_beside_the_job(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: c}\n---\n"
        "apiVersion: kubetrain.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: j}\nspec: {}\n"
    )
    assert manifest.load(path).name == "j"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("spec: [", "not valid YAML"),
        ("", "found 0"),
        ("- a\n- b\n", "expected a TrainingJob mapping"),
    ],
)
def test_unreadable_files_say_why(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    with pytest.raises(manifest.InvalidTrainingJob, match=message):
        manifest.load(path)
