"""Checkpoints on object storage on a real node: a TrainingJob with no PVC at all, only
`checkpoint.objectStore` on a SeaweedFS server (on the node's bridge IP, which pods reach) and a
credentials Secret, survives `kubectl delete pod` with 0 steps lost, of node 1's pod (the stop
save) and of node 0's in a gang of 3 (the survivors' save, committed once)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import obstore
import pytest
from support import nodepods
from support.controlplane import Unavailable
from support.nodeconfig import NODE_IP
from support.realjobs import RealJobs, job_manifest, real_jobs
from support.s3server import S3Server
from support.waiting import wait_for

from kubetrain.api.models import ObjectStoreConfig
from kubetrain.api.records import records_in
from kubetrain.trainer.objectstore import ObjectStore

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
    assert stop["step"] == reached and stop["path"].startswith(f"{url}/step-{reached}-a0-r"), stop
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


def test_node_0s_pod_deleted_the_survivors_commit_its_step_once_and_the_gang_resumes_it(
    jobs: tuple[RealJobs, S3Server], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """3 nodes, and node 0's pod (which holds the rendezvous store) deleted mid-run: with no store
    to elect one saver, both survivors save the last step, each with bytes of its own (its RNG
    state). One writer per commit (trainer/objectstore.py): the step is committed once, from one
    payload whose bytes match its commit, and the next attempt resumes it: 0 steps lost. Rank 0
    hangs at step 30 first (a fault), so that no stop save of node 0 can keep the step instead."""
    real, server = jobs
    server.create_bucket("survivors")
    url = "s3://survivors/three"
    env = server.env()
    real.kubectl(
        "create", "secret", "generic", "survivors-store", "-n", NAMESPACE,
        f"--from-literal=AWS_ACCESS_KEY_ID={env['AWS_ACCESS_KEY_ID']}",
        f"--from-literal=AWS_SECRET_ACCESS_KEY={env['AWS_SECRET_ACCESS_KEY']}",
    )  # fmt: skip
    job = job_manifest(
        "survivors", NAMESPACE, overlay=real.overlay, fault="hang,rank=0,step=30",
        training={"epochs": 20, "logEverySteps": 1},
    )  # fmt: skip
    job["spec"]["nodes"] = 3
    job["spec"]["checkpoint"] = {
        "dir": "/checkpoints",
        "everySteps": 1_000_000,  # periodic saves off (an epoch's end saves: 14 steps of 3 nodes)
        "keep": 100,  # nothing pruned: the test reads step 30's commit after the run
        "objectStore": {"url": url, "endpoint": server.endpoint, "credentialsSecret": "survivors-store"},
    }
    real.apply(job)
    wait_for(lambda: len(real.pods("survivors")) == 3, 300, "the 3 pods")
    # Rank 0 trained step 30 and hangs there, before logging it; the survivors wait for it in step
    # 31's all-reduce, holding step 30.
    hung = "KUBETRAIN_FAULT: injecting hang at step 30"
    node0 = ("logs", "survivors-node-0", "-c", "trainer", "-n", NAMESPACE)
    wait_for(lambda: hung in real.kubectl(*node0, check=False).stdout, 600, "rank 0 hung at step 30", interval=1)
    real.kubectl("delete", "pod", "survivors-node-0", "-n", NAMESPACE, "--grace-period=1", "--wait=false")

    done = real.wait("survivors", succeeded, "Succeeded", 900)
    status = done["status"]
    assert status["failures"][0]["rank"] == 0, status["failures"]
    first = real.logs("survivors", 0)
    assert max(r["step"] for r in records_of(first) if r["event"] == "step") < 30, "rank 0 hung at step 30"
    saved = [line for line in first.splitlines() if "a peer is gone: step 30 saved in" in line]
    assert {line.partition("]")[0] for line in saved} <= {"[node-1", "[node-2"} and saved, first[-6000:]
    # Each survivor reports the commit that holds the step: the one that finished first.
    assert len({line.rpartition(" saved in ")[2].strip() for line in saved}) == 1, saved

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    store = ObjectStore(ObjectStoreConfig(url=url, endpoint=server.endpoint), job="reader", attempt=0)
    commits = [e for e in store.read_log() if e.kind == "commit" and e.step == 30]
    assert len(commits) == 1, f"step 30 is committed once, whichever survivor finished first: {commits}"
    store.download(commits[0], tmp_path / "step-30.pt")  # raises unless its bytes match the commit
    assert saved[0].rpartition(" saved in ")[2].strip() == store.url(commits[0].folder), saved
    written = {meta["path"].split("/")[0] for meta in obstore.list(store.store).collect()}
    assert [name for name in written if name.startswith("step-30-")] == [commits[0].folder], "the other removed"

    second = records_of(real.logs("survivors", status["attempt"]))
    (resumed,) = [r for r in second if r["event"] == "resume"]
    # Step 30 is the last step every rank trained, and no save but the survivors' holds it.
    assert (resumed["step"], resumed["path"]) == (30, store.url(commits[0].folder)), "0 steps lost"
    assert not [r for r in second if r["event"] == "checkpoint_skipped"], "the newest commit was usable"
    real.delete("survivors")
