"""kopf wiring only: what the watches see goes to the `Controller` (operator/controller.py),
which kopf hands every handler through its memo (`kubetrain.operator.run` puts it there).

Why event handlers and a work queue rather than kopf's on.create/on.update:
  * Those keep per-object progress in annotations and a last-handled-configuration,
    i.e. extra writes on every change; a level-based reconciler needs neither, and the
    TrainingJob status already holds all the state that must survive a restart.
  * A job must be reconciled when any of its pods changes; the queue coalesces the bursts
    (4 pods created -> 1 reconcile, not 4) and serializes reconciles of one job.
kopf watches the TrainingJobs only; the pods and Services go from our own watches straight
to the controller (operator/informer.py). The startup handler, which kopf finishes before it
watches anything, lists the children and the TrainingJobs first: a restarted operator never
mistakes "not in my cache yet" for "missing" (which would recreate single pods of a running
gang), and /readyz (operator/health.py) means that every job is known. Only then does this
process stand for leader (operator/leader.py); until it leads its work queue runs nothing.

No finalizer on TrainingJobs: children carry a controller ownerReference, so the garbage
collector removes them with the job, and the operator never blocks a job's deletion. Pods
carry one of their own (`kubetrain.dev/logs`, operator/archive.py): a deleted pod waits until
the operator kept its log tail, and a pod of a deleted job only until the operator sees it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, cast

import aiohttp
import kopf

from kubetrain.api import naming
from kubetrain.operator import kueue
from kubetrain.operator.controller import Controller
from kubetrain.operator.informer import Informer, list_jobs
from kubetrain.operator.kube import ApiError
from kubetrain.operator.leader import Leadership
from kubetrain.operator.pods import PodView

log = logging.getLogger("kubetrain.operator")
API_RETRY_SECONDS = 1.0
# How long the requests in flight at shutdown may take to return before the Lease is given up
# under them (a hung one is then left to its preconditions: each write is safe to repeat).
DRAIN_SECONDS = 5.0


class NoDiffBase(kopf.AnnotationsDiffBaseStorage):
    """An empty diff base ("essence"). kopf builds one on every watch event for its change
    detection, a deep copy of the whole body and then another in the progress storage: 12 %
    of the operator's CPU at 200 jobs x 4 nodes (benchmarks/results/operator_profile.json).
    Only change (on.create/update/delete), daemon and timer handlers read it, and this
    operator has none (see above); tests/operator/test_diffbase.py fails if one is added."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return cast(kopf.BodyEssence, {})


def _leadership(memo: kopf.Memo) -> Leadership:
    leadership = memo.get("leadership")
    if leadership is None:
        raise kopf.PermanentError("kopf's memo holds no leadership: start the operator with `kubetrain operator`")
    return cast(Leadership, leadership)


def _controller(memo: kopf.Memo) -> Controller:
    controller = memo.get("controller")
    if not isinstance(controller, Controller):
        raise kopf.PermanentError("kopf's memo holds no controller: start the operator with `kubetrain operator`")
    return controller


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    controller = _controller(memo)
    namespaces = controller.settings.namespaces
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
    settings.scanning.disabled = bool(namespaces) and not any(c in n for n in namespaces for c in "*?[")
    # kopf waits this long for more events of an object before handling the newest: 0.1 s
    # by default, all of it added to a new job's time-to-pods. The handler only enqueues,
    # and the queue coalesces bursts itself.
    settings.batching.batch_window = 0.01
    # After an API server outage kopf retries its list and watch with backoffs of 1, 1, 2, 3,
    # 5, 8, 13, 21 s: a job created just after a 40 s outage waited 12-21 s. Every second, as
    # our own watches do, for as long as kopf's default would try (then it starts over).
    settings.networking.error_backoffs = [API_RETRY_SECONDS] * 60
    pods = Informer(controller.kube, "pods", namespaces, PodView.from_pod, controller.pod_changed)
    services = Informer(controller.kube, "services", namespaces, _name, controller.service_changed)
    try:
        jobs, *_ = await asyncio.gather(list_jobs(controller.kube, namespaces), pods.list(), services.list())
    except (ApiError, aiohttp.ClientError, TimeoutError) as error:
        raise kopf.TemporaryError(f"listing the TrainingJobs and their children failed: {error}", delay=2) from error
    controller.watch(pods.index, services.index)
    for job in jobs:
        controller.job_seen(job)
    controller.synced = True
    # Startup and cleanup handlers share kopf's root memo; per-object handlers get copies.
    memo["watches"] = [asyncio.create_task(informer.run()) for informer in (pods, services)]
    memo["watches"].append(asyncio.create_task(_leadership(memo).run()))


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    """Hand over: stop writing (a reconcile in flight is cut at its next write, which is safe
    at any line: the successor reconciles every job), let the requests already sent return,
    give the Lease back (a standby leads at once), stop watching. Nobody writes between the
    resignation and the release."""
    controller, leadership = _controller(memo), _leadership(memo)
    await leadership.resign()
    if not await controller.queue.drain(DRAIN_SECONDS):
        unanswered = len(controller.queue.tasks)
        log.warning("requests of %d reconciles unanswered after %.0f s; stopping anyway", unanswered, DRAIN_SECONDS)
    await leadership.release()
    for task in memo.get("watches", ()):
        task.cancel()


@kopf.on.event(naming.GROUP, naming.VERSION, naming.PLURAL)
async def trainingjob_event(
    type: str, body: kopf.Body, namespace: str | None, name: str, memo: kopf.Memo, **_: Any
) -> None:
    if type == "DELETED":
        _controller(memo).job_deleted((namespace or "", name))
    else:
        _controller(memo).job_seen(_to_dict(body))


def _name(service: dict[str, Any]) -> str:
    return str(service["metadata"]["name"])


# Kueue's Workloads of queued jobs (operator/kueue.py): an admission or eviction wakes the
# job. Without Kueue's CRDs installed kopf serves nothing here and says so at startup.
@kopf.on.event(kueue.GROUP, kueue.VERSION, "workloads", labels={naming.LABEL_MANAGED_BY: naming.MANAGED_BY})
async def workload_event(namespace: str | None, labels: Mapping[str, str], memo: kopf.Memo, **_: Any) -> None:
    if naming.LABEL_JOB in labels:
        _controller(memo).workload_changed((namespace or "", labels[naming.LABEL_JOB]))


def _to_dict(body: Mapping[str, Any]) -> dict[str, Any]:
    # Each watch event is freshly parsed JSON that kopf never mutates, so a shallow copy is
    # a stable snapshot; a deep copy of every pod was a fifth of the operator's CPU when 50
    # jobs arrived at once.
    return dict(body)
