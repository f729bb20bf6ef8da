"""spec.template locally: mapped, or refused naming the volume and the flag; never ignored."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from support.jobs import BYO_DATA, bare_job, write_job
from support.local_runs import run_cli

from kubetrain.api.models import TrainingJob
from kubetrain.local.plan import NodeProcess
from kubetrain.local.volumes import NO_CHOICES, LocalChoices, UnmappableError, plan_volumes

pytestmark = pytest.mark.unit


def job(template: dict[str, Any], **spec: Any) -> TrainingJob:
    return TrainingJob.model_validate(bare_job(command=["python", "train.py"], template=template, **spec))


def trainer(volumes: list[dict[str, Any]], mounts: list[dict[str, Any]], **container: Any) -> dict[str, Any]:
    return {"spec": {"volumes": volumes, "containers": [{"name": "trainer", "volumeMounts": mounts, **container}]}}


def node(argv: list[str], env: dict[str, str] | None = None) -> NodeProcess:
    return NodeProcess(rank=0, pod_name="j-node-0", argv=argv, env=env or {})


def test_each_volume_kind_maps_to_a_local_directory(tmp_path: Path) -> None:
    given = tmp_path / "given"
    given.mkdir()
    template = trainer(
        [
            {"name": "host", "hostPath": {"path": "/srv/shared"}},
            {"name": "scratch", "emptyDir": {}},
            {"name": "data", "persistentVolumeClaim": {"claimName": "imagenet"}},
        ],
        [
            {"name": "host", "mountPath": "/shared"},
            {"name": "scratch", "mountPath": "/work"},
            {"name": "data", "mountPath": "/data", "subPath": "train"},
        ],
        workingDir="/work/out",
    )
    volumes = plan_volumes(job(template), LocalChoices((f"data={given}",)))
    run_dir = tmp_path / "run"
    localized = volumes.localize(
        node(["python", "train.py", "/data/x.csv", "--cache=/shared/c", "/database"], {"IN": "/work", "RANK": "/data"}),
        run_dir,
    )
    assert localized.argv == ["python", "train.py", f"{given}/train/x.csv", "--cache=/srv/shared/c", "/database"]
    # The contract's names are kubetrain's: never rewritten.
    assert localized.env == {"IN": str(run_dir.resolve() / "volumes" / "scratch"), "RANK": "/data"}
    assert localized.cwd == str(run_dir.resolve() / "volumes" / "scratch" / "out")
    run_dir.mkdir()
    volumes.prepare(run_dir)
    record = json.loads((run_dir / "local-volumes.json").read_text())
    assert record["volumes"] == {
        "host": {"kind": "hostPath", "local": "/srv/shared"},
        "scratch": {"kind": "emptyDir", "local": str(run_dir.resolve() / "volumes" / "scratch")},
        "data": {"kind": "persistentVolumeClaim (--volume)", "local": str(given)},
    }
    assert record["workingDir"] == {"rendered": "/work/out", "local": localized.cwd}
    assert (run_dir / "volumes" / "scratch").is_dir()


def test_a_working_dir_of_the_image_stays_where_kubetrain_runs() -> None:
    volumes = plan_volumes(job({"spec": {"containers": [{"name": "trainer", "workingDir": "/opt/app"}]}}), NO_CHOICES)
    assert volumes.localize(node(["python", "train.py"]), Path("run")).cwd is None
    assert "workingDir /opt/app -> the directory kubetrain runs in (the image)" in volumes.describe(Path("run"))


@pytest.mark.parametrize(
    ("template", "choices", "message"),
    [
        (
            {"spec": {"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "c"}}]}},
            NO_CHOICES,
            "spec.template.spec.volumes[0] (data): a persistentVolumeClaim volume exists only on a cluster; "
            "map it to a local directory with --volume data=DIR",
        ),
        (
            {"spec": {"volumes": [{"name": "creds", "secret": {"secretName": "s"}}]}},
            NO_CHOICES,
            "--volume creds=DIR",
        ),
        (
            {"spec": {"volumes": [{"name": "labels", "configMap": {"name": "l"}}]}},
            NO_CHOICES,
            "--volume labels=DIR",
        ),
        ({}, LocalChoices(("data=/tmp",)), "--volume data: spec.template.spec.volumes has no volume 'data' (none)"),
        ({}, LocalChoices(("data",)), "--volume 'data': expected NAME=DIR"),
        (
            {"spec": {"volumes": [{"name": "d", "emptyDir": {}}]}},
            LocalChoices(("d=/no/such/dir",)),
            "--volume d=/no/such/dir: not a directory",
        ),
        ({"spec": {"imagePullSecrets": [{"name": "regcred"}]}}, NO_CHOICES, "pass --no-image"),
        (
            {"spec": {"initContainers": [{"name": "proxy", "image": "envoy", "restartPolicy": "Always"}]}},
            NO_CHOICES,
            "spec.template.spec.initContainers (proxy): a local run runs only the trainer's command; "
            "pass --no-init-containers",
        ),
        (
            {"spec": {"containers": [{"name": "trainer", "envFrom": [{"secretRef": {"name": "s"}}]}]}},
            LocalChoices(no_image=True, no_init_containers=True),
            "spec.template.spec.containers[0].envFrom: ConfigMaps and Secrets exist only on a cluster",
        ),
    ],
)
def test_what_cannot_be_mapped_is_refused_naming_the_way_out(
    template: dict[str, Any], choices: LocalChoices, message: str
) -> None:
    with pytest.raises(UnmappableError) as error:
        plan_volumes(job(template), choices)
    assert message in str(error.value)


def test_every_refusal_is_named_at_once() -> None:
    template = {
        "spec": {
            "imagePullSecrets": [{"name": "regcred"}],
            "volumes": [{"name": "a", "secret": {"secretName": "s"}}, {"name": "b", "configMap": {"name": "c"}}],
        }
    }
    with pytest.raises(UnmappableError) as error:
        plan_volumes(job(template), NO_CHOICES)
    assert [line.split(":")[0].strip() for line in str(error.value).splitlines()] == [
        "spec.template.spec.imagePullSecrets",
        "spec.template.spec.volumes[0] (a)",
        "spec.template.spec.volumes[1] (b)",
    ]


def test_acknowledged_and_meaningless_parts_are_noted() -> None:
    template = {
        "metadata": {"annotations": {"sidecar.istio.io/inject": "false"}},
        "spec": {
            "imagePullSecrets": [{"name": "regcred"}],
            "initContainers": [{"name": "proxy", "image": "envoy"}],
            "affinity": {"nodeAffinity": {}},
        },
    }
    volumes = plan_volumes(job(template), LocalChoices(no_image=True, no_init_containers=True))
    assert list(volumes.notes) == [
        "spec.template.metadata.annotations: no local meaning, not applied",
        "spec.template.spec.affinity: no local meaning, not applied",
        "spec.template.spec.imagePullSecrets: --no-image: the command runs in this environment",
        "spec.template.spec.initContainers: --no-init-containers: not run",
    ]


def test_cli_refuses_a_pvc_without_volume_and_starts_nothing(tmp_path: Path) -> None:
    done = run_cli("run", str(BYO_DATA), "--local", "--run-dir", str(tmp_path / "run"))
    assert done.returncode == 2, done.stderr
    assert "spec.template.spec.volumes[0] (dataset)" in done.stderr and "--volume dataset=DIR" in done.stderr
    assert not (tmp_path / "run" / "local-rewrites.json").exists()


def test_working_dir_empty_dir_and_host_path_through_real_processes(tmp_path: Path) -> None:
    """A node copies a file from a hostPath mount into its workingDir, an emptyDir."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "data.txt").write_text("payload")
    script = "import os, shutil, sys; shutil.copy(sys.argv[1], f'copy-{os.environ[\"NODE_RANK\"]}.txt')"
    document = bare_job(
        "mounts",
        nodes=2,
        command=[sys.executable, "-c", script, "/in/data.txt"],
        template=trainer(
            [{"name": "in", "hostPath": {"path": str(tmp_path / "in")}}, {"name": "work", "emptyDir": {}}],
            [{"name": "in", "mountPath": "/in"}, {"name": "work", "mountPath": "/work"}],
            workingDir="/work",
        ),
    )
    run_dir = tmp_path / "run"
    done = run_cli("run", str(write_job(tmp_path, document)), "--local", "--run-dir", str(run_dir), timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in (0, 1):
        assert (run_dir / "volumes" / "work" / f"copy-{rank}.txt").read_text() == "payload"
    assert "/work -> " in done.stdout and "workingDir /work -> " in done.stdout
