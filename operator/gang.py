"""Gang scheduling with Kubernetes' own PodGroup (scheduling.k8s.io/v1alpha2, kube-scheduler's
GangScheduling plugin): which mode a job gets, and the objects that mode needs. Pure.

`native`: every attempt gets one PodGroup with the gang policy (minCount = nodes) and every
pod of the attempt names it in `spec.schedulingGroup.podGroupName`; kube-scheduler then binds
all of the attempt's pods or none, so two jobs competing for the same nodes never both sit
half-placed holding accelerators. The API is alpha in Kubernetes 1.36: the API server serves
it with `--runtime-config=scheduling.k8s.io/v1alpha2=true` and the GenericWorkload feature
gate, and kube-scheduler enforces it with GenericWorkload and GangScheduling.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from kubetrain.api import naming
from kubetrain.api.models import TrainingJob, TrainingJobSpec
from kubetrain.operator.render import MANAGED_BY, owner_reference

GROUP = "scheduling.k8s.io"
VERSION = "v1alpha2"
API_VERSION = f"{GROUP}/{VERSION}"
PLURAL = "podgroups"
FEATURE_GATES = ("GenericWorkload", "GangScheduling")
DEFAULT_SCHEDULER = "default-scheduler"
# The job condition that records the mode chosen for the current attempt: the controller
# renders the attempt's pods from it, so a discovery answer that changes mid-attempt never
# gives one attempt's pods two different modes.
CONDITION = "GangScheduling"
NOT_SERVED = (
    f"{API_VERSION} PodGroup is not served by this cluster (it needs the API server's "
    f"--runtime-config={API_VERSION}=true and the feature gates "
    f"{'=true,'.join(FEATURE_GATES)}=true on the API server, kube-controller-manager and kube-scheduler)"
)


@dataclass(frozen=True)
class Choice:
    """The gang mode of an attempt; `mode` None: the job asked for what the cluster lacks."""

    mode: Literal["native", "none"] | None
    reason: str
    message: str


def choose(spec: TrainingJobSpec, served: bool) -> Choice:
    """spec.scheduling.gang resolved against discovery (`served`: the PodGroup API is)."""
    asked = spec.scheduling.gang
    group = f"a {API_VERSION} PodGroup per attempt (gang policy, minCount {spec.nodes})"
    if asked == "none":
        return Choice("none", "Disabled", "spec.scheduling.gang is none: pods are scheduled one by one")
    if not served:
        if asked == "native":
            return Choice(None, "GangSchedulingUnavailable", f"spec.scheduling.gang is native, but {NOT_SERVED}")
        return Choice("none", "NotServed", f"gang auto: pods are scheduled one by one, as {NOT_SERVED}")
    if asked == "auto" and spec.scheduler_name not in (None, DEFAULT_SCHEDULER):
        # Another scheduler ignores kube-scheduler's PodGroup; it brings its own gang support.
        message = f"gang auto: schedulerName {spec.scheduler_name} places the pods, so no {API_VERSION} PodGroup"
        return Choice("none", "OtherScheduler", message)
    return Choice("native", "PodGroup", f"gang {asked}: {group}")


def podgroup_name(job: str, attempt: int) -> str:
    # The attempt has no dash, so names of different jobs never collide.
    return f"{job}-{attempt}"


def podgroup_labels(job: TrainingJob, uid: str, attempt: int) -> dict[str, str]:
    return {
        naming.LABEL_JOB: job.name,
        naming.LABEL_JOB_UID: uid,
        naming.LABEL_ATTEMPT: str(attempt),
        naming.LABEL_MANAGED_BY: MANAGED_BY,
    }


def render_podgroup(job: TrainingJob, namespace: str, uid: str, attempt: int) -> dict[str, Any]:
    """The attempt's PodGroup, owned by the job (garbage-collected with it)."""
    return {
        "apiVersion": API_VERSION,
        "kind": "PodGroup",
        "metadata": {
            "name": podgroup_name(job.name, attempt),
            "namespace": namespace,
            "labels": podgroup_labels(job, uid, attempt),
            "ownerReferences": [owner_reference(job, uid)],
        },
        "spec": {
            "schedulingPolicy": {"gang": {"minCount": job.spec.nodes}},
            # Preempting one rank stops the whole gang anyway (a gang restart): let the
            # scheduler count the group as one victim. The API server drops the field (it
            # stores the default, Pod) unless the WorkloadAwarePreemption gate is on.
            "disruptionMode": "PodGroup",
        },
    }


def stale_selector(uid: str, attempt: int) -> str:
    """Label selector of the job's PodGroups of other attempts (a deletecollection removes them)."""
    return f"{naming.LABEL_JOB_UID}={uid},{naming.LABEL_ATTEMPT}!={attempt}"


def join(pod: dict[str, Any], podgroup: str) -> dict[str, Any]:
    """The pod, as a member of `podgroup` (the field is immutable once the pod exists)."""
    return {**pod, "spec": {**pod["spec"], "schedulingGroup": {"podGroupName": podgroup}}}
