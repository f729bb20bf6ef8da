"""Gang scheduling: which mode a job gets, and the PodGroup objects that mode needs. Pure.

`native`: Kubernetes' own PodGroup (kube-scheduler's GangScheduling plugin), in the version the
cluster serves: scheduling.k8s.io/v1beta1 (Kubernetes 1.37, where the gang's minCount is mutable)
before v1alpha2 (1.36, where the whole spec is immutable). Every attempt gets one PodGroup with the
gang policy (minCount = nodes) and every pod of the attempt names it in
`spec.schedulingGroup.podGroupName`; kube-scheduler then binds all of the attempt's pods or none,
so two jobs competing for the same nodes never both sit half-placed holding accelerators. Neither
version is on by default: the API server serves it with `--runtime-config=<version>=true` and the
GenericWorkload feature gate, and kube-scheduler enforces it with GenericWorkload (on 1.36 also
GangScheduling, a gate 1.37 folded into GenericWorkload).

An elastic job (spec.elastic) gets one PodGroup for its whole life instead, with minCount =
minNodes: kube-scheduler places its first minNodes pods together or none of them, and every pod
after those (a grown gang's, a lost pod's replacement) one by one, as the group has its quorum
already. The operator creates those first minNodes pods, node 0 among them, before the others
(elastic.py), so the quorum always holds node 0, whose agent hosts the gang's store. Its
disruption mode is the default (one pod at a time): losing one pod only shrinks an elastic gang.
On v1beta1 the operator keeps minCount equal to spec.elastic.minNodes when a user changes it; on
v1alpha2 the group keeps the minCount it was created with.

`coscheduling`: the PodGroup of kubernetes-sigs/scheduler-plugins (scheduling.x-k8s.io/v1alpha1,
minMember = nodes), which pods join by the label `scheduling.x-k8s.io/pod-group`, for clusters
whose scheduler runs the Coscheduling plugin.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from kubetrain.api import naming
from kubetrain.api.models import TrainingJob, TrainingJobSpec, TrainingJobStatus
from kubetrain.operator.conditions import get_condition
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


NATIVE_BETA = GroupApi("scheduling.k8s.io", "v1beta1", "PodGroup")
NATIVE_ALPHA = GroupApi("scheduling.k8s.io", "v1alpha2", "PodGroup")
# Kubernetes' versions of its PodGroup, the preferred first (discovery picks the first served).
NATIVE_VERSIONS = (NATIVE_BETA, NATIVE_ALPHA)
COSCHEDULING = GroupApi("scheduling.x-k8s.io", "v1alpha1", "Coscheduling")
APIS: dict[Mode, tuple[GroupApi, ...]] = {"native": NATIVE_VERSIONS, "coscheduling": (COSCHEDULING,)}
# Every PodGroup API discovery asks about.
ALL_APIS = (*NATIVE_VERSIONS, COSCHEDULING)
# The versions whose spec.schedulingPolicy.gang.minCount may change after creation (1.37's
# "mutable to support workload scaling"); in v1alpha2 the whole schedulingPolicy is immutable.
MUTABLE_MIN_COUNT = frozenset({NATIVE_BETA.api_version})
# How each version says "disrupt the group as one": v1alpha2's enum, v1beta1's one-of union.
DISRUPT_TOGETHER: dict[str, Any] = {NATIVE_ALPHA.api_version: "PodGroup", NATIVE_BETA.api_version: {"all": {}}}
# The gates that turn the native PodGroup on: 1.37's one (the scheduler's GangScheduling plugin
# comes with it), and 1.36's two. A gate a version does not know stops its components at start.
FEATURE_GATES = ("GenericWorkload",)
FEATURE_GATES_1_36 = ("GenericWorkload", "GangScheduling")
COSCHEDULING_LABEL = "scheduling.x-k8s.io/pod-group"
DEFAULT_SCHEDULER = "default-scheduler"
# The job condition that records the mode chosen for the current attempt: every later decide of
# the attempt reads it back and hands the mode to the controller in its Decision, so a discovery
# answer that changes mid-attempt never gives one attempt's pods two different modes.
CONDITION = "GangScheduling"
NOT_SERVED = {
    "native": (
        f"neither {NATIVE_BETA.api_version} nor {NATIVE_ALPHA.api_version} PodGroup is served by this cluster "
        f"(it needs the API server's --runtime-config={NATIVE_BETA.api_version}=true, or "
        f"{NATIVE_ALPHA.api_version}=true before Kubernetes 1.37, and the feature gate "
        f"{'=true,'.join(FEATURE_GATES)}=true, {'=true,'.join(FEATURE_GATES_1_36)}=true before 1.37, "
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


def served_api(mode: Mode, served: frozenset[str]) -> GroupApi | None:
    """The API version a mode's PodGroup is written in: the first of its versions served."""
    if mode == "none":
        return None
    return next((api for api in APIS[mode] if api.api_version in served), None)


def choose(spec: TrainingJobSpec, served: frozenset[str]) -> Choice:
    """spec.scheduling.gang resolved against discovery (`served`: the PodGroup API versions served)."""
    asked = spec.scheduling.gang
    if asked == "none":
        return Choice("none", "Disabled", "spec.scheduling.gang is none: pods are scheduled one by one")
    mode: Mode = "native" if asked == "auto" else asked
    api = served_api(mode, served)
    if api is None:
        if asked != "auto":
            return Choice(None, "GangSchedulingUnavailable", f"spec.scheduling.gang is {asked}, but {NOT_SERVED[mode]}")
        return Choice("none", "NotServed", f"gang auto: pods are scheduled one by one, as {NOT_SERVED[mode]}")
    if asked == "auto" and spec.scheduler_name not in (None, DEFAULT_SCHEDULER):
        # Another scheduler ignores kube-scheduler's PodGroup; it brings its own gang support.
        message = f"gang auto: schedulerName {spec.scheduler_name} places the pods, so no {api.api_version} PodGroup"
        return Choice("none", "OtherScheduler", message)
    if spec.elastic is not None:  # native (auto or asked for): the API's rules refuse coscheduling
        low = spec.min_nodes
        follows = (
            "it follows spec.elastic.minNodes"
            if api.api_version in MUTABLE_MIN_COUNT
            else "fixed while the group lives: this version's PodGroup is immutable"
        )
        message = (
            f"gang {asked}: one {api.api_version} PodGroup for the job (minCount {low}, {follows}): "
            f"its first {low} pods are placed together, the others one by one as capacity comes"
        )
        return Choice(mode, api.reason, message)
    size = "minCount" if mode == "native" else "minMember"
    return Choice(mode, api.reason, f"gang {asked}: a {api.api_version} PodGroup per attempt ({size} {spec.nodes})")


def api_for(mode: Mode, served: frozenset[str] | None) -> GroupApi | None:
    """The PodGroup API an attempt in `mode` joins now: the first of its versions served (discovery
    may have moved from v1alpha2 to v1beta1 with an upgrade: the object is the same, the pods name
    it by name); an API gone since the attempt chose it: its first version, which the API server
    refuses. None for mode "none"."""
    if mode == "none":
        return None
    return served_api(mode, served or frozenset()) or APIS[mode][0]


def recorded_mode(status: TrainingJobStatus) -> Mode:
    """The mode the GangScheduling condition recorded for the current attempt ("none" before any)."""
    recorded = get_condition(status, CONDITION)
    return "none" if recorded is None else attempt_mode(recorded.status, recorded.reason)


def attempt_mode(condition_status: str, reason: str) -> Mode:
    """The mode the GangScheduling condition recorded for the current attempt."""
    if condition_status != "True":
        return "none"
    # A reason this operator does not know (a newer one wrote it) names no PodGroup it can make.
    return next((mode for mode, apis in APIS.items() if apis[0].reason == reason), "none")


ELASTIC_SUFFIX = "elastic"


def podgroup_name(job: TrainingJob, attempt: int) -> str:
    """The attempt's PodGroup; an elastic job's one for its whole life. An attempt has no dash and
    is a number, so names of different jobs never collide."""
    return f"{job.name}-{ELASTIC_SUFFIX if job.spec.elastic is not None else attempt}"


def render_podgroup(job: TrainingJob, namespace: str, uid: str, attempt: int, api: GroupApi) -> dict[str, Any]:
    """The attempt's PodGroup in `api` (a native version or coscheduling's), owned by the job."""
    if api in NATIVE_VERSIONS:
        spec: dict[str, Any] = _gang_spec(job)
        if job.spec.elastic is None:
            # Preempting one rank stops the whole gang anyway (a gang restart): let the
            # scheduler count the group as one victim. 1.37 stores it as written; 1.36 dropped it
            # (storing the default, one pod) unless the WorkloadAwarePreemption gate was on.
            spec["disruptionMode"] = DISRUPT_TOGETHER[api.api_version]
    else:
        spec = {"minMember": job.spec.min_nodes}
    labels = {
        naming.LABEL_JOB: job.name,
        naming.LABEL_JOB_UID: uid,
        naming.LABEL_MANAGED_BY: MANAGED_BY,
    }
    if job.spec.elastic is None:  # an elastic job's group outlives its attempts
        labels[naming.LABEL_ATTEMPT] = str(attempt)
    return {
        "apiVersion": api.api_version,
        "kind": "PodGroup",
        "metadata": {
            "name": podgroup_name(job, attempt),
            "namespace": namespace,
            "labels": labels,
            "ownerReferences": [owner_reference(job, uid)],
        },
        "spec": spec,
    }


def stale_selector(uid: str, attempt: int) -> str:
    """Label selector of the job's PodGroups of other attempts (a deletecollection removes them)."""
    return f"{naming.LABEL_JOB_UID}={uid},{naming.LABEL_ATTEMPT}!={attempt}"


def _gang_spec(job: TrainingJob) -> dict[str, Any]:
    return {"schedulingPolicy": {"gang": {"minCount": job.spec.min_nodes}}}


def min_count_patch(job: TrainingJob) -> dict[str, Any]:
    """The merge patch that sets a native PodGroup's minCount to the job's (v1beta1 takes it)."""
    return {"spec": _gang_spec(job)}


def join(pod: dict[str, Any], podgroup: str, mode: Mode) -> dict[str, Any]:
    """The pod, as a member of `podgroup`: by `spec.schedulingGroup` (native, immutable once the
    pod exists) or by label (coscheduling)."""
    if mode == "coscheduling":
        labels = {**pod["metadata"].get("labels", {}), COSCHEDULING_LABEL: podgroup}
        return {**pod, "metadata": {**pod["metadata"], "labels": labels}}
    return {**pod, "spec": {**pod["spec"], "schedulingGroup": {"podGroupName": podgroup}}}
