"""Kueue's side of a reconcile, the I/O: the job's Workload and the admitted ResourceFlavors
read, and what operator/kueue.py (pure) decides written, through kube.py. Decides nothing."""

from __future__ import annotations

import asyncio
from datetime import datetime

from kubetrain.api import naming
from kubetrain.api.models import TrainingJob
from kubetrain.operator import kueue
from kubetrain.operator.decision import Hold
from kubetrain.operator.kube import Kube, Refused
from kubetrain.operator.pods import PodView
from kubetrain.operator.render import RenderSettings, render_pod

# A queued job whose Workload cannot be created yet (its WorkloadPriorityClass is missing, the
# API server refused it) looks again this often.
WORKLOAD_RETRY_SECONDS = 30.0
# The flavors an admission named, and where they place the pods.
Placed = tuple[tuple[str, ...], kueue.Placement]


async def admission(
    kube: Kube, render: RenderSettings, namespace: str, uid: str, job: TrainingJob, pods: list[PodView], now: datetime
) -> kueue.Admission:
    """Kueue's say on a queued job: create its Workload, hand back an evicted one's quota,
    mark a finished job's Workload Finished. Other jobs just run."""
    if kueue.queue_name(job) is None:
        return kueue.Admission(None)
    workload = await kube.get_kueue("workloads", kueue.workload_name(job.name), namespace)
    if workload is not None and workload["metadata"].get("labels", {}).get(naming.LABEL_JOB_UID) != uid:
        workload = None  # a deleted job's of the same name, which the garbage collector is removing
    conditions = (job.status.conditions if job.status else None) or []
    ended = next((c for c in conditions if c.type in ("Succeeded", "Failed") and c.status == "True"), None)
    if ended is not None:
        done = None if workload is None else kueue.finish(workload, ended.type == "Succeeded", ended.message, now)
        if workload is not None and done is not None:
            await kube.replace_workload_status(workload, done)
        return kueue.Admission(None)
    if workload is None:
        return await _create_workload(kube, render, namespace, uid, job)
    verdict = kueue.admission(job, workload, pods_left=bool(pods))
    if verdict.acknowledge:
        await kube.replace_workload_status(workload, kueue.acknowledge_eviction(workload, now))
    elif (spec := kueue.respec(job, workload)) is not None:
        await kube.replace_workload_spec(workload, spec)
    return verdict


async def _create_workload(
    kube: Kube, render: RenderSettings, namespace: str, uid: str, job: TrainingJob
) -> kueue.Admission:
    priority, name = None, kueue.priority_class(job)
    if name is not None:
        found = await kube.get_kueue("workloadpriorityclasses", name)
        if found is None:
            message = f"the label {kueue.PRIORITY_LABEL} names WorkloadPriorityClass {name}, which does not exist"
            return kueue.Admission(Hold("WorkloadPriorityClassNotFound", message), retry=True)
        priority = int(found.get("value", 0))
    attempt = job.status.attempt if job.status else 0
    pod = render_pod(job, namespace, uid, 0, attempt, render)
    workload = kueue.render_workload(job, namespace, uid, pod, priority)
    try:
        await kube.create_workload(workload)
    except Refused as refused:
        message = f"the API server refused Workload {workload['metadata']['name']}: {refused.message}"
        return kueue.Admission(Hold("WorkloadRefused", message), retry=True)
    message = f"created Workload {workload['metadata']['name']} in LocalQueue {kueue.queue_name(job)}"
    return kueue.Admission(Hold("WaitingForAdmission", message))


async def placement(kube: Kube, flavors: tuple[str, ...], cached: Placed | None) -> Placed:
    """The node labels and tolerations of the admitted flavors, read again only when the
    admission names other flavors than `cached`. Raises LookupError for a missing flavor."""
    if cached is not None and cached[0] == flavors:
        return cached
    found = await asyncio.gather(*(kube.get_kueue("resourceflavors", f) for f in flavors))
    missing = [name for name, flavor in zip(flavors, found, strict=True) if flavor is None]
    if missing:
        raise LookupError(f"ResourceFlavor {missing[0]} not found")
    return flavors, kueue.placement([f for f in found if f is not None])
