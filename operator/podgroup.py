"""Gang scheduling: which mode a job gets, and the PodGroup objects that mode needs. Pure.

`native`: Kubernetes' own PodGroup (scheduling.k8s.io/v1alpha2, kube-scheduler's GangScheduling
plugin). Every attempt gets one PodGroup with the gang policy (minCount = nodes) and every pod
of the attempt names it in `spec.schedulingGroup.podGroupName`; kube-scheduler then binds all
of the attempt's pods or none, so two jobs competing for the same nodes never both sit
half-placed holding accelerators. The API is alpha in Kubernetes 1.36: the API server serves
it with `--runtime-config=scheduling.k8s.io/v1alpha2=true` and the GenericWorkload feature
gate, and kube-scheduler enforces it with GenericWorkload and GangScheduling.

`coscheduling`: the PodGroup of kubernetes-sigs/scheduler-plugins (scheduling.x-k8s.io/v1alpha1,
minMember = nodes), which pods join by the label `scheduling.x-k8s.io/pod-group`, for clusters
whose scheduler runs the Coscheduling plugin.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from kubetrain.api import naming
from kubetrain.api.models import TrainingJob, TrainingJobSpec
from kubetrain.operator.render import MANAGED_BY, owner_reference

Mode = Literal["native", "coscheduling", "none"]


@dataclass(frozen=True)
class GroupApi:
    """A PodGroup API: where it lives, and the condition reason of the mode that uses it."""

    group: str
    version: str
    reason: str
    plural: str = "podgroups"

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


NATIVE = GroupApi("scheduling.k8s.io", "v1alpha2", "PodGroup")
COSCHEDULING = GroupApi("scheduling.x-k8s.io", "v1alpha1", "Coscheduling")
APIS: dict[Mode, GroupApi] = {"native": NATIVE, "coscheduling": COSCHEDULING}
FEATURE_GATES = ("GenericWorkload", "GangScheduling")
COSCHEDULING_LABEL = "scheduling.x-k8s.io/pod-group"
DEFAULT_SCHEDULER = "default-scheduler"
# The job condition that records the mode chosen for the current attempt: the controller
# renders the attempt's pods from it, so a discovery answer that changes mid-attempt never
# gives one attempt's pods two different modes.
CONDITION = "GangScheduling"
NOT_SERVED = {
    "native": (
        f"{NATIVE.api_version} PodGroup is not served by this cluster (it needs the API server's "
        f"--runtime-config={NATIVE.api_version}=true and the feature gates {'=true,'.join(FEATURE_GATES)}=true "
        "on the API server, kube-controller-manager and kube-scheduler)"
    ),
    "coscheduling": (
        f"{COSCHEDULING.api_version} PodGroup is not served by this cluster (install the scheduler-plugins "
        "PodGroup CRD and a scheduler running the Coscheduling plugin)"
    ),
}


@dataclass(frozen=True)
class Choice:
    """The gang mode of an attempt; `mode` None: the job asked for what the cluster lacks."""

    mode: Mode | None
    reason: str
    message: str


def choose(spec: TrainingJobSpec, served: frozenset[str]) -> Choice:
    """spec.scheduling.gang resolved against discovery (`served`: the PodGroup API versions served)."""
    asked = spec.scheduling.gang
    if asked == "none":
        return Choice("none", "Disabled", "spec.scheduling.gang is none: pods are scheduled one by one")
    if spec.elastic is not None:
        # A PodGroup's minCount is fixed per attempt here, and an elastic gang forms from the pods
        # that run (operator/elastic.py): its pods are placed one by one, gang or not.
        return Choice(
            "none", "Elastic", "spec.elastic: pods are scheduled one by one; the gang forms from those that run"
        )
    mode: Mode = "native" if asked == "auto" else asked
    api = APIS[mode]
    if api.api_version not in served:
        if asked != "auto":
            return Choice(None, "GangSchedulingUnavailable", f"spec.scheduling.gang is {asked}, but {NOT_SERVED[mode]}")
        return Choice("none", "NotServed", f"gang auto: pods are scheduled one by one, as {NOT_SERVED[mode]}")
    if asked == "auto" and spec.scheduler_name not in (None, DEFAULT_SCHEDULER):
        # Another scheduler ignores kube-scheduler's PodGroup; it brings its own gang support.
        message = f"gang auto: schedulerName {spec.scheduler_name} places the pods, so no {api.api_version} PodGroup"
        return Choice("none", "OtherScheduler", message)
    size = "minCount" if mode == "native" else "minMember"
    return Choice(mode, api.reason, f"gang {asked}: a {api.api_version} PodGroup per attempt ({size} {spec.nodes})")


def attempt_mode(condition_status: str, reason: str) -> Mode:
    """The mode the GangScheduling condition recorded for the current attempt."""
    if condition_status != "True":
        return "none"
    # A reason this operator does not know (a newer one wrote it) names no PodGroup it can make.
    return next((mode for mode, api in APIS.items() if api.reason == reason), "none")


def podgroup_name(job: str, attempt: int) -> str:
    # The attempt has no dash, so names of different jobs never collide.
    return f"{job}-{attempt}"


def render_podgroup(job: TrainingJob, namespace: str, uid: str, attempt: int, mode: Mode) -> dict[str, Any]:
    """The attempt's PodGroup for `mode` (native or coscheduling), owned by the job."""
    if mode == "native":
        spec: dict[str, Any] = {
            "schedulingPolicy": {"gang": {"minCount": job.spec.nodes}},
            # Preempting one rank stops the whole gang anyway (a gang restart): let the
            # scheduler count the group as one victim. The API server drops the field (it
            # stores the default, Pod) unless the WorkloadAwarePreemption gate is on.
            "disruptionMode": "PodGroup",
        }
    else:
        spec = {"minMember": job.spec.nodes}
    labels = {
        naming.LABEL_JOB: job.name,
        naming.LABEL_JOB_UID: uid,
        naming.LABEL_ATTEMPT: str(attempt),
        naming.LABEL_MANAGED_BY: MANAGED_BY,
    }
    return {
        "apiVersion": APIS[mode].api_version,
        "kind": "PodGroup",
        "metadata": {
            "name": podgroup_name(job.name, attempt),
            "namespace": namespace,
            "labels": labels,
            "ownerReferences": [owner_reference(job, uid)],
        },
        "spec": spec,
    }


def stale_selector(uid: str, attempt: int) -> str:
    """Label selector of the job's PodGroups of other attempts (a deletecollection removes them)."""
    return f"{naming.LABEL_JOB_UID}={uid},{naming.LABEL_ATTEMPT}!={attempt}"


def join(pod: dict[str, Any], podgroup: str, mode: Mode) -> dict[str, Any]:
    """The pod, as a member of `podgroup`: by `spec.schedulingGroup` (native, immutable once the
    pod exists) or by label (coscheduling)."""
    if mode == "coscheduling":
        labels = {**pod["metadata"].get("labels", {}), COSCHEDULING_LABEL: podgroup}
        return {**pod, "metadata": {**pod["metadata"], "labels": labels}}
    return {**pod, "spec": {**pod["spec"], "schedulingGroup": {"podGroupName": podgroup}}}
