"""An elastic gang on a real node (spec.elastic, docs/elastic.md), with real pods of the trainer
image and the operator of this tree. The node's capacity is an extended resource each pod requests
one of (`kubetrain.dev/slot`, advertised by patching the node's status, as a device plugin would):
the test sets how many pods fit, and the scheduler does the rest.

One job of range 2-3 goes through every change of size the product promises:
  * capacity for 2: it trains with 2, the third pod waits for a node;
  * capacity 3: it grows to 3 in place, no pod's UID changes;
  * capacity 2 and node 2's pod evicted: it shrinks to 2 in place, its restart count unchanged;
  * capacity 3: it grows back to 3;
  * capacity 1 and two pods evicted: it waits (BelowMinNodes) without failing;
  * capacity 3: it forms again and Succeeds.
Every step's samples are in the trainer's ledger (test mode): each epoch covers the training set
once, and each step trains the global batch an undisturbed run trains (the seeded order, cut into
global batches: kubetrain.trainer.cursor.GlobalBatches, the same at every size)."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from typing import Any

import pytest
from support.ledgers import ledger_steps
from support.realjobs import RealJobs, job_manifest, pvc, records

from kubetrain.api.contract import LEDGER_ENV
from kubetrain.api.training import TrainingSpec
from kubetrain.trainer.cursor import GlobalBatches
from kubetrain.trainer.data import load_splits

pytestmark = [pytest.mark.node, pytest.mark.timeout(30 * 60)]

NAMESPACE = "elastic"
SLOT = "kubetrain.dev/slot"
NAME = "elastic"
TRAINING: dict[str, Any] = {
    "dataset": "digits",
    # 14 steps each. Every resize happens by step ~300 (measured: 295 at 31 s, idle, where training
    # runs fastest against the resizes' fixed waits); the rest only trains to the end.
    "epochs": 80,
    "batchSize": 32,
    "globalBatchSize": 96,
    "seed": 3,
    "logEverySteps": 5,
}
COOLDOWN_S = 5


def _capacity(jobs: RealJobs, slots: int) -> None:
    """Advertise `slots` of the extended resource on the node (capacity and allocatable)."""
    node = jobs.kubectl("get", "nodes", "-o", "jsonpath={.items[0].metadata.name}").stdout.strip()
    key = SLOT.replace("/", "~1")
    patch = [
        {"op": "add", "path": f"/status/capacity/{key}", "value": str(slots)},
        {"op": "add", "path": f"/status/allocatable/{key}", "value": str(slots)},
    ]
    jobs.kubectl("patch", "node", node, "--subresource=status", "--type=json", "-p", json.dumps(patch))


def _evict(jobs: RealJobs, pod: str) -> None:
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": NAMESPACE}}
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}/eviction"
    jobs.kubectl("create", "--raw", path, "-f", "-", input=json.dumps(eviction))


def _uids(jobs: RealJobs) -> dict[str, str]:
    return jobs.pods(NAME)


def _training_at(size: int, after_step: int) -> Any:
    """A predicate: the gang trains at `size` nodes past `after_step` (rank 0's progress)."""

    def check(job: dict[str, Any]) -> dict[str, Any] | None:
        status = job.get("status") or {}
        step = (status.get("progress") or {}).get("step") or 0
        line = status.get("timeline") or {}
        trained = line.get("attempt") == status.get("attempt") and line.get("firstStepAt")
        return job if status.get("size") == size and trained and step > after_step else None

    return check


def _step(job: dict[str, Any]) -> int:
    return int(((job.get("status") or {}).get("progress") or {}).get("step") or 0)


class Phases:
    """When each stage was reached and at which step, printed as it goes: where the test's minutes
    went, and how many steps the job had to spare (TRAINING's epochs are sized from it)."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def __call__(self, what: str, job: dict[str, Any]) -> dict[str, Any]:
        print(f"[{time.monotonic() - self.t0:6.1f} s] {what}: step {_step(job)}", flush=True)
        return job


def test_an_elastic_gang_trains_on_the_nodes_there_are(jobs: RealJobs) -> None:
    reached = Phases()
    _capacity(jobs, 2)
    volume = jobs.node.hostpath_volume(NAME)
    manifest = job_manifest(NAME, NAMESPACE, overlay=jobs.overlay, training=TRAINING, checkpoint_steps=1_000_000)
    spec = manifest["spec"]
    spec["nodes"] = 3
    spec["elastic"] = {"minNodes": 2, "scaleUpCooldownSeconds": COOLDOWN_S}
    spec["env"].append({"name": LEDGER_ENV, "value": "/checkpoints/ledger"})
    spec["resources"] = {"requests": {SLOT: "1"}, "limits": {SLOT: "1"}}
    jobs.apply(pvc(NAME, NAMESPACE), manifest)

    # Capacity for 2: the gang is 2 of 2-3, node 0 and whichever pod got the other slot; the third
    # pod waits for a node.
    job = reached("training at 2", jobs.wait(NAME, _training_at(2, 10), "training at 2", 600))
    members = job["status"]["members"]
    assert len(members) == 2 and members[0] == 0 and job["status"]["restarts"] == 0, job["status"]
    pending = [p["metadata"]["name"] for p in jobs.pod_objects(NAME) if p["status"].get("phase") == "Pending"]
    (waiting_node,) = {1, 2} - set(members)
    assert pending == [f"{NAME}-node-{waiting_node}"]
    first = _uids(jobs)
    assert len(first) == 3

    # Capacity 3: it grows to 3 in place.
    _capacity(jobs, 3)
    job = reached("grown to 3", jobs.wait(NAME, _training_at(3, _step(job)), "grown to 3", 300))
    assert _uids(jobs) == first, "no pod's UID changed"
    assert job["status"]["restarts"] == 0

    # Capacity 2, node 2's pod evicted: it shrinks to 2 and trains on.
    _capacity(jobs, 2)
    _evict(jobs, f"{NAME}-node-2")
    job = reached("shrunk to 2", jobs.wait(NAME, _training_at(2, _step(job)), "shrunk to 2", 300))
    assert (job["status"]["restarts"], job["status"]["members"]) == (0, [0, 1])
    kept = {name: uid for name, uid in first.items() if name != f"{NAME}-node-2"}
    assert {name: uid for name, uid in _uids(jobs).items() if name in kept} == kept, "the others' pods stayed"

    # Capacity 3 again: back to 3.
    _capacity(jobs, 3)
    job = reached("grown back to 3", jobs.wait(NAME, _training_at(3, _step(job)), "grown back to 3", 300))
    assert job["status"]["restarts"] == 0

    # Capacity 1 and two pods evicted: below the minimum, the job waits without failing.
    _capacity(jobs, 1)
    for node in (1, 2):
        _evict(jobs, f"{NAME}-node-{node}")

    def waiting(job: dict[str, Any]) -> dict[str, Any] | None:
        below = next((c for c in job["status"].get("conditions") or [] if c["type"] == "BelowMinNodes"), None)
        return job if below is not None and below["status"] == "True" and job["status"].get("size") == 0 else None

    job = reached("waiting below the minimum", jobs.wait(NAME, waiting, "waiting below the minimum", 300))
    waited_at = _step(job)
    assert job["status"]["restarts"] == 0 and job["status"].get("phase") != "Failed"

    # Capacity back: it forms again and finishes.
    _capacity(jobs, 3)

    def succeeded(job: dict[str, Any]) -> dict[str, Any] | None:
        done = next((c for c in job["status"].get("conditions") or [] if c["type"] == "Succeeded"), None)
        return job if done is not None and done["status"] == "True" else None

    job = reached("Succeeded", jobs.wait(NAME, succeeded, "Succeeded", 900))
    status = job["status"]
    assert (status["restarts"], status["uncountedRestarts"]) == (0, 0), status
    sizes = [(r["fromSize"], r["toSize"]) for r in status["resizes"]]
    # The two evictions may be seen in one pass (3 -> 0) or one after the other (3 -> 2 -> 0).
    assert sizes[:4] == [(0, 2), (2, 3), (3, 2), (2, 3)], status["resizes"]
    assert sizes[4:6] in ([(3, 0), (0, 2)], [(3, 0), (0, 3)], [(3, 2), (2, 0)]), status["resizes"]
    assert all(to >= 2 for _, to in sizes[6:]), status["resizes"]
    assert _step(job) > waited_at

    # Exactly once, and the undisturbed run's global batches, across every resize.
    spec_model = TrainingSpec.model_validate(TRAINING)
    batches = GlobalBatches(len(load_splits(spec_model).train), spec_model.global_batch_size or 0, seed=spec_model.seed)
    steps = ledger_steps(volume / "ledger", once=True)
    per_epoch = batches.steps_per_epoch
    assert sorted(steps) == list(range(1, per_epoch * TRAINING["epochs"] + 1))
    assert {world for _, _, world in steps.values()} == {2, 3}
    by_epoch: dict[int, set[int]] = defaultdict(set)
    orders = {epoch: batches.order(epoch).tolist() for epoch in range(TRAINING["epochs"])}
    for step, (epoch, samples, _) in steps.items():
        start, end = batches.window((step - 1) % per_epoch * batches.global_batch)
        assert samples == frozenset(orders[epoch][start:end]), f"step {step} trained other samples"
        assert not by_epoch[epoch] & samples, f"epoch {epoch} trained a sample twice"
        by_epoch[epoch] |= samples
    assert {len(samples) for samples in by_epoch.values()} == {batches.epoch_samples}

    # Each resize resumed at the step the gang had reached (no step trained twice, the ledger said):
    # a resume record for each attempt that trained after the first gang (an attempt superseded
    # before its gang met, as when two evictions come one after the other, trains nothing).
    resumed = [r["attempt"] for r in records(volume) if r["event"] == "resume"]
    assert len(resumed) == len(set(resumed)) >= 4 and 1 not in resumed, (resumed, sizes)
    jobs.delete(NAME)
