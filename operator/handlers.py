"""kopf wiring only: what the watches see goes to the `Controller` (operator/controller.py),
which kopf hands every handler through its memo (`kubetrain.operator.run` puts it there).

Why event handlers and a work queue rather than kopf's on.create/on.update:
  * Those keep per-object progress in annotations and a last-handled-configuration,
    i.e. extra writes on every change; a level-based reconciler needs neither, and the
    TrainingJob status already holds all the state that must survive a restart.
  * A job must be reconciled when any of its pods changes; the queue coalesces the bursts
    (4 pods created -> 1 reconcile, not 4) and serializes reconciles of one job.
Pods and Services are kopf indices: kopf fills them from its initial listing before any
other handler runs, so a restarted operator never mistakes "not in my cache yet" for
"missing" (which would recreate single pods of a running gang).

No finalizer: children carry a controller ownerReference, so the garbage collector removes
them with the job, and the operator never blocks a deletion.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import kopf

from kubetrain.api import naming
from kubetrain.operator.controller import Controller
from kubetrain.operator.pods import PodView

CHILD_LABELS = {naming.LABEL_JOB: kopf.PRESENT}


class NoDiffBase(kopf.AnnotationsDiffBaseStorage):
    """An empty diff base ("essence"). kopf builds one on every watch event for its change
    detection, a deep copy of the whole body and then another in the progress storage: 12 %
    of the operator's CPU at 200 jobs x 4 nodes (benchmarks/results/operator_profile.json).
    Only change (on.create/update/delete), daemon and timer handlers read it, and this
    operator has none (see above); tests/operator/test_diffbase.py fails if one is added."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return cast(kopf.BodyEssence, {})


def _controller(memo: kopf.Memo) -> Controller:
    controller = memo.get("controller")
    if not isinstance(controller, Controller):
        raise kopf.PermanentError("kopf's memo holds no controller: start the operator with `kubetrain operator`")
    return controller


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **kwargs: Any) -> None:
    controller = _controller(memo)
    # kopf hands the same live indices to every handler, startup ones included.
    controller.watch(kwargs["pods_by_job"], kwargs["services_by_job"])
    # kopf's own bookkeeping, should a change handler ever be added, lives under our prefix.
    settings.persistence.finalizer = f"{naming.GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=naming.GROUP)
    settings.persistence.diffbase_storage = NoDiffBase(prefix=naming.GROUP, key="last-handled-configuration")
    # Events are posted by kube.py for condition transitions only; kopf would post one per
    # handler log line.
    settings.posting.enabled = False
    settings.watching.server_timeout = 300
    # With exact namespaces there is nothing to discover cluster-wide (and a namespaced Role
    # cannot grant the CRD/namespace lists kopf would retry for about a minute).
    namespaces = controller.settings.namespaces
    settings.scanning.disabled = bool(namespaces) and not any(c in n for n in namespaces for c in "*?[")
    # kopf waits this long for more events of an object before handling the newest: 0.1 s
    # by default, all of it added to a new job's time-to-pods. The handlers only enqueue,
    # and the queue coalesces bursts itself.
    settings.batching.batch_window = 0.01


@kopf.index("", "v1", "pods", labels=CHILD_LABELS)
async def pods_by_job(
    namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any
) -> dict[tuple[str | None, str], PodView]:
    # The index keeps what the function returns for as long as the pod exists: the view
    # reconciling reads, not the pod (operator/pods.py).
    return {(namespace, labels[naming.LABEL_JOB]): PodView.from_pod(body)}


@kopf.index("", "v1", "services", labels=CHILD_LABELS)
async def services_by_job(
    namespace: str | None, labels: Mapping[str, str], name: str, **_: Any
) -> dict[tuple[str | None, str], str]:
    return {(namespace, labels[naming.LABEL_JOB]): name}


@kopf.on.event(naming.GROUP, naming.VERSION, naming.PLURAL)
async def trainingjob_event(
    type: str, body: kopf.Body, namespace: str | None, name: str, memo: kopf.Memo, **_: Any
) -> None:
    if type == "DELETED":
        _controller(memo).job_deleted((namespace or "", name))
    else:
        _controller(memo).job_seen(_to_dict(body))


@kopf.on.event("", "v1", "pods", labels=CHILD_LABELS)
async def pod_event(
    type: str, body: kopf.Body, namespace: str | None, labels: Mapping[str, str], memo: kopf.Memo, **_: Any
) -> None:
    gone = (body.metadata.uid or "") if type == "DELETED" else None
    _controller(memo).pod_changed((namespace or "", labels[naming.LABEL_JOB]), gone)


@kopf.on.event("", "v1", "services", labels=CHILD_LABELS)
async def service_event(type: str, namespace: str | None, labels: Mapping[str, str], memo: kopf.Memo, **_: Any) -> None:
    _controller(memo).service_changed((namespace or "", labels[naming.LABEL_JOB]), gone=type == "DELETED")


def _to_dict(body: Mapping[str, Any]) -> dict[str, Any]:
    # Each watch event is freshly parsed JSON that kopf never mutates, so a shallow copy is
    # a stable snapshot; a deep copy of every pod was a fifth of the operator's CPU when 50
    # jobs arrived at once.
    return dict(body)
