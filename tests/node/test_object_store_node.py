"""Checkpoints on object storage on a real node: a TrainingJob with no PVC at all, only
`checkpoint.objectStore` on a SeaweedFS server (on the node's bridge IP, which pods reach) and a
credentials Secret, survives `kubectl delete pod` with 0 steps lost."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support import nodepods
from support.controlplane import Unavailable
from support.nodeconfig import NODE_IP
from support.realjobs import RealJobs, job_manifest, real_jobs
from support.s3server import S3Server
from support.waiting import wait_for

from kubetrain.api.records import records_in

pytestmark = [pytest.mark.node, pytest.mark.timeout(30 * 60)]

NAMESPACE = "objectstore"
SECRET = "checkpoint-store"


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RealJobs, S3Server]]:
    nodepods.node_or_skip()
    try:
        with real_jobs(tmp_path_factory.mktemp("object-store"), NAMESPACE) as running, S3Server(ip=NODE_IP) as server:
            yield running, server
    except Unavailable as missing:
        pytest.skip(str(missing))


def records_of(logs: str) -> list[dict[str, Any]]:
    """Rank 0's records in `kubetrain logs` output (each line prefixed `[node-i] `)."""
    return records_in("\n".join(line.partition("] ")[2] for line in logs.splitlines()))


def succeeded(job: dict[str, Any]) -> dict[str, Any] | None:
    found = next((c for c in job["status"].get("conditions") or [] if c["type"] == "Succeeded"), None)
    return job if found is not None and found["status"] == "True" else None


def test_a_job_with_only_an_object_store_loses_no_step_to_a_deleted_pod(jobs: tuple[RealJobs, S3Server]) -> None:
    real, server = jobs
    server.create_bucket("ckpt")
    url = "s3://ckpt/deleted"
    env = server.env()
    real.kubectl(
        "create", "secret", "generic", SECRET, "-n", NAMESPACE,
        f"--from-literal=AWS_ACCESS_KEY_ID={env['AWS_ACCESS_KEY_ID']}",
        f"--from-literal=AWS_SECRET_ACCESS_KEY={env['AWS_SECRET_ACCESS_KEY']}",
    )  # fmt: skip
    job = job_manifest("deleted", NAMESPACE, overlay=real.overlay, training={"epochs": 20, "logEverySteps": 1})
    job["spec"]["checkpoint"] = {
        "dir": "/checkpoints",
        "everySteps": 1_000_000,  # periodic saves off: only the stop save can keep the steps
        "keep": 2,
        "objectStore": {"url": url, "endpoint": server.endpoint, "credentialsSecret": SECRET},
    }
    real.apply(job)
    wait_for(lambda: len(real.pods("deleted")) == 2, 300, "the pods")
    real.wait("deleted", lambda j: (j["status"].get("progress") or {}).get("step", 0) >= 30, "step 30")

    uid = real.pods("deleted")["deleted-node-1"]
    deleted_at = time.monotonic()
    real.kubectl("delete", "pod", "deleted-node-1", "-n", NAMESPACE, "--wait=false")

    def gone() -> bool:  # the pod object itself, not only marked for deletion (a new one takes its name)
        found = real.kubectl("get", "pod", "deleted-node-1", "-n", NAMESPACE, "-o", "json", check=False)
        return found.returncode != 0 or json.loads(found.stdout)["metadata"]["uid"] != uid

    wait_for(gone, 120, "node 1's pod gone", interval=0.2)
    print(f"\nnode 1's pod gone {time.monotonic() - deleted_at:.1f} s after the delete")
    done = real.wait("deleted", succeeded, "Succeeded", 900)
    status = done["status"]
    assert status["failures"][0]["reason"] == "PodDeleted", status["failures"]

    first, second = records_of(real.logs("deleted", 0)), records_of(real.logs("deleted", 1))
    reached = max(r["step"] for r in first if r["event"] == "step")
    (stop,) = [r for r in first if r["event"] == "checkpoint" and r.get("reason") == "signal"]
    assert stop["step"] == reached and stop["path"] == f"{url}/step-{reached}-a0", stop
    (resumed,) = [r for r in second if r["event"] == "resume"]
    assert (resumed["step"], resumed["path"]) == (reached, stop["path"]), "0 steps lost"
    assert status["lastCheckpoint"]["path"].startswith(url + "/step-"), status["lastCheckpoint"]

    pods = json.loads(real.kubectl("get", "pods", "-n", NAMESPACE, "-o", "json").stdout)["items"]
    volumes = [v for p in pods for v in p["spec"]["volumes"]]
    assert not [v for v in volumes if "persistentVolumeClaim" in v], "no PVC anywhere"
    secret_value = env["AWS_SECRET_ACCESS_KEY"]
    assert secret_value not in json.dumps(done) and secret_value not in real.logs("deleted", 0) + real.logs(
        "deleted", 1
    )
    events = real.kubectl("get", "events", "-n", NAMESPACE, "-o", "json").stdout
    assert secret_value not in events
    real.delete("deleted")
