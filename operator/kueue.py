"""Kueue admission as an external framework, pure: what the operator writes to and reads
from Kueue's `Workload` (kueue.x-k8s.io/v1beta2). No client: the controller fetches the
objects and applies what these functions return.

The contract is the one Kueue's own job integrations follow (sigs.k8s.io/kueue
pkg/controller/jobframework/reconciler.go); Kueue admits Workloads whatever created them,
and `integrations.externalFrameworks: ["TrainingJob.v1alpha1.kubetrain.dev"]` tells it that
a TrainingJob's Workload has a controller outside Kueue:
  * A job labelled `kueue.x-k8s.io/queue-name` gets one Workload, owned by the job, with one
    pod set (count = nodes, the rendered pod template), held (`Hold`) until it is admitted.
  * Admitted (condition Admitted True): the pods get the node labels and tolerations of the
    ResourceFlavors the admission assigned (`placement`), and the gang runs.
  * Evicted (condition Evicted True, e.g. preempted): the pods are deleted and the job held
    again; once none is left, the quota is handed back as jobframework does
    (`acknowledge_eviction`), and Kueue admits it again later: the new attempt resumes from
    the checkpoint. The lost attempt counts as a disruption, not against maxRestarts.
  * An elastic job's pod set carries minCount = spec.elastic.minNodes: Kueue's partial admission
    (beta, on by default) may admit fewer nodes than `nodes`, down to that minimum, when the
    quota has no room for all. The operator then creates no pod beyond the admitted count
    (`Admission.count`): the gang trains, shrinks and grows back within what Kueue admitted.
  * Finished job: the Workload gets condition Finished (`finish`), which releases its quota.
  * runPolicy.suspend deactivates the Workload (`respec`): Kueue evicts it, and the quota is
    handed back as after a preemption; unsuspended, it queues again.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kubetrain.api import naming
from kubetrain.api.models import TrainingJob
from kubetrain.operator.decision import Hold
from kubetrain.operator.render import owner_reference

GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"
API_VERSION = f"{GROUP}/{VERSION}"
QUEUE_LABEL = f"{GROUP}/queue-name"
PRIORITY_LABEL = f"{GROUP}/priority-class"
# The entry users add to Kueue's Configuration: Kind.version.group.
EXTERNAL_FRAMEWORK = f"{naming.KIND}.{naming.VERSION}.{naming.GROUP}"
POD_SET = "nodes"
# Kueue's reasons for an eviction after which the Workload is requeued (Requeued True).
REQUEUED_EVICTIONS = ("Preempted", "NodeFailures")
# What makes the rendered rank-0 pod rank 0: the pod set stands for every rank.
RANK_IDENTITY = ("hostname",)
RANK_LABELS = (naming.LABEL_NODE_RANK, naming.LABEL_ROLE, naming.LABEL_ATTEMPT)


def queue_name(job: TrainingJob) -> str | None:
    """The LocalQueue a job is submitted to; None: Kueue does not manage it."""
    return (job.metadata.labels or {}).get(QUEUE_LABEL) or None


def priority_class(job: TrainingJob) -> str | None:
    return (job.metadata.labels or {}).get(PRIORITY_LABEL) or None


def workload_name(job_name: str) -> str:
    """One Workload per job (job names are DNS-1035 labels, well under the 253 allowed)."""
    return f"{naming.SINGULAR}-{job_name}"


def render_workload(
    job: TrainingJob, namespace: str, uid: str, pod: dict[str, Any], priority: int | None
) -> dict[str, Any]:
    """The Workload of a job: `pod` is its rendered rank-0 pod, whose spec (resources, GPUs,
    nodeSelector, tolerations) is what Kueue needs to pick a flavor and count quota; every
    rank asks for the same (its hostname and rank labels are left out). `priority` is the
    value of the job's WorkloadPriorityClass: Kueue orders and preempts by spec.priority,
    which only the creator can fill in."""
    queue = queue_name(job)
    assert queue is not None, "only jobs with a queue get a Workload"
    spec = {k: copy.deepcopy(v) for k, v in pod["spec"].items() if k not in RANK_IDENTITY}
    labels = {k: v for k, v in (pod["metadata"].get("labels") or {}).items() if k not in RANK_LABELS}
    template = {"metadata": {"labels": labels}, "spec": spec}
    workload_spec: dict[str, Any] = {
        "active": not job.spec.run_policy.suspend,
        "queueName": queue,
        "podSets": [{"name": POD_SET, "count": job.spec.nodes, "template": template}],
    }
    if job.spec.elastic is not None:
        workload_spec["podSets"][0]["minCount"] = job.spec.elastic.min_nodes
    name = priority_class(job)
    if name is not None:
        workload_spec["priorityClassRef"] = {"group": GROUP, "kind": "WorkloadPriorityClass", "name": name}
        workload_spec["priority"] = priority
    return {
        "apiVersion": API_VERSION,
        "kind": "Workload",
        "metadata": {
            "name": workload_name(job.name),
            "namespace": namespace,
            "labels": {
                # Kueue names the job by this in its messages (a preemption's "JobUID").
                f"{GROUP}/job-uid": uid,
                naming.LABEL_JOB: job.name,
                naming.LABEL_JOB_UID: uid,
                naming.LABEL_MANAGED_BY: naming.MANAGED_BY,
            },
            # Garbage-collected with the job; Kueue adds no finalizer to a Workload it did not create.
            "ownerReferences": [owner_reference(job, uid)],
        },
        "spec": workload_spec,
    }


def _condition(workload: dict[str, Any], kind: str) -> dict[str, Any] | None:
    conditions = (workload.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == kind), None)


def _true(workload: dict[str, Any], kind: str) -> bool:
    condition = _condition(workload, kind)
    return condition is not None and condition.get("status") == "True"


@dataclass(frozen=True)
class Placement:
    """Where the admission put the gang: the node labels and tolerations of its flavors."""

    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class Admission:
    """What the operator does about a Workload: run (hold None, on `flavors`) or hold."""

    hold: Hold | None
    flavors: tuple[str, ...] = ()
    # The pods are gone and Kueue still counts the evicted Workload's quota: hand it back.
    acknowledge: bool = False
    # The Workload could not be created: look again later.
    retry: bool = False
    # How many nodes the admission counted (podSetAssignments[].count): fewer than `nodes` only
    # for an elastic job that Kueue admitted partially. None: not admitted, or not said.
    count: int | None = None


def admission(job: TrainingJob, workload: dict[str, Any], pods_left: bool) -> Admission:
    """Run or hold, from the Workload's conditions (level-based, like `status.decide`)."""
    queue, name = queue_name(job), workload["metadata"]["name"]
    evicted = _condition(workload, "Evicted")
    if evicted is not None and evicted.get("status") == "True":
        reason = str(evicted.get("reason") or "Evicted")
        detail = evicted.get("message", "")
        message = f"Kueue evicted Workload {name} ({reason}): {detail}; no pods until it is admitted again"
        hold = Hold("Evicted" + reason if reason != "Evicted" else reason, message, disruption=True)
        return Admission(hold, acknowledge=not pods_left and _true(workload, "QuotaReserved"))
    if _true(workload, "Admitted"):
        assignments = ((workload.get("status") or {}).get("admission") or {}).get("podSetAssignments") or []
        flavors = sorted({f for a in assignments for f in (a.get("flavors") or {}).values()})
        counts = [a["count"] for a in assignments if a.get("name") == POD_SET and isinstance(a.get("count"), int)]
        return Admission(None, tuple(flavors), count=counts[0] if counts else None)
    reserved = _condition(workload, "QuotaReserved")
    detail = f": {reserved['message']}" if reserved and reserved.get("message") else ""
    message = f"waiting for Kueue to admit Workload {name} in LocalQueue {queue}{detail}"
    return Admission(Hold("WaitingForAdmission", message))


def respec(job: TrainingJob, workload: dict[str, Any]) -> dict[str, Any] | None:
    """The Workload's spec when it must change, else None: runPolicy.suspend deactivates it,
    so Kueue evicts it and frees its quota while the job is suspended (what Kueue's own
    integrations get from a suspended job); a job relabelled to another LocalQueue moves its
    Workload there until it holds quota (as jobframework does; a reserved one stays put)."""
    spec = dict(workload.get("spec") or {})
    wanted: dict[str, Any] = {"active": not job.spec.run_policy.suspend}
    if not _true(workload, "QuotaReserved"):
        wanted["queueName"] = queue_name(job)
    current = {"active": spec.get("active", True), "queueName": spec.get("queueName")}
    return None if all(current[k] == v for k, v in wanted.items()) else {**spec, **wanted}


def placement(flavors: list[dict[str, Any]]) -> Placement:
    """The node labels and tolerations of the assigned ResourceFlavors (spec.nodeLabels,
    spec.tolerations), merged as jobframework's podset.FromAssignment does."""
    selector: dict[str, str] = {}
    tolerations: list[dict[str, Any]] = []
    for flavor in flavors:
        spec = flavor.get("spec") or {}
        selector.update(spec.get("nodeLabels") or {})
        tolerations += [t for t in spec.get("tolerations") or [] if t not in tolerations]
    return Placement(selector, tuple(tolerations))


def place(pod: dict[str, Any], where: Placement) -> dict[str, Any]:
    """The pod with the flavor's node labels and tolerations added to its own."""
    if not where.node_selector and not where.tolerations:
        return pod
    spec = dict(pod["spec"])
    if where.node_selector:
        spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **where.node_selector}
    own = list(spec.get("tolerations") or [])
    if where.tolerations:
        spec["tolerations"] = own + [t for t in where.tolerations if t not in own]
    return {**pod, "spec": spec}


def _set(status: dict[str, Any], kind: str, value: bool, reason: str, message: str, now: str, generation: Any) -> None:
    """metav1.Condition semantics: lastTransitionTime moves only when the status flips."""
    conditions = status.setdefault("conditions", [])
    wanted = "True" if value else "False"
    existing = next((c for c in conditions if c.get("type") == kind), None)
    since = existing["lastTransitionTime"] if existing and existing.get("status") == wanted else now
    condition = {
        "type": kind,
        "status": wanted,
        "reason": reason,
        "message": message[:32_768],
        "lastTransitionTime": since,
        "observedGeneration": generation,
    }
    if existing is None:
        conditions.append(condition)
    else:
        conditions[conditions.index(existing)] = condition


def _stamp(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def acknowledge_eviction(workload: dict[str, Any], now: datetime) -> dict[str, Any]:
    """The status jobframework writes once an evicted job's pods are gone: Requeued (True
    after a preemption or node failure), QuotaReserved and Admitted False, no admission. Kueue
    then queues the Workload again."""
    status = copy.deepcopy(workload.get("status") or {})
    evicted = _condition(workload, "Evicted") or {}
    reason, message = str(evicted.get("reason") or "Evicted"), str(evicted.get("message") or "evicted")
    generation, stamp = workload["metadata"].get("generation"), _stamp(now)
    _set(status, "Requeued", reason in REQUEUED_EVICTIONS, reason, message, stamp, generation)
    _set(status, "QuotaReserved", False, "Pending", message, stamp, generation)
    _set(status, "Admitted", False, "NoReservation", "The workload has no reservation", stamp, generation)
    status.pop("admission", None)
    return status


def finish(workload: dict[str, Any], succeeded: bool, message: str, now: datetime) -> dict[str, Any] | None:
    """The status with condition Finished (reason Succeeded or Failed): Kueue then releases
    the quota. None when it is finished already."""
    if _true(workload, "Finished"):
        return None
    status = copy.deepcopy(workload.get("status") or {})
    reason = "Succeeded" if succeeded else "Failed"
    _set(status, "Finished", True, reason, message, _stamp(now), workload["metadata"].get("generation"))
    return status
