"""The PodGroup side of a reconcile, the I/O: which PodGroup APIs the cluster serves
(discovery, cached), the attempt's PodGroup created, and an elastic job's minCount kept equal to
spec.elastic.minNodes. operator/podgroup.py decides what they are; this module only asks and
writes, through kube.py."""

from __future__ import annotations

import asyncio
import logging
import time

from kubetrain.api.models import TrainingJob
from kubetrain.operator import podgroup, refusal
from kubetrain.operator.kube import ApiError, Kube, Refused

log = logging.getLogger("kubetrain.operator")
# How long a discovery answer (which PodGroup APIs are served?) is trusted: feature gates and
# CRDs change rarely.
DISCOVERY_TTL_SECONDS = 300.0


class Discovery:
    """The PodGroup API versions the cluster serves, asked again after DISCOVERY_TTL_SECONDS."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self._served: tuple[float, frozenset[str]] | None = None  # (monotonic time, served)
        # One discovery request at a time: a burst of new jobs must not send one each.
        self._lock = asyncio.Lock()

    async def served(self) -> frozenset[str]:
        async with self._lock:
            now = time.monotonic()
            if self._served is None or now - self._served[0] > DISCOVERY_TTL_SECONDS:
                found = [
                    api.api_version for api in podgroup.ALL_APIS if await self.kube.serves(api.api_version, api.plural)
                ]
                self._served = (now, frozenset(found))
            return self._served[1]


async def create(
    kube: Kube, job: TrainingJob, namespace: str, uid: str, attempt: int, api: podgroup.GroupApi
) -> refusal.Refusal | None:
    """The attempt's PodGroup (an elastic job's one), after older attempts' ones are deleted (they
    go with their attempt; the API server keeps each until its pods are gone). The refusal, if any."""
    if job.spec.elastic is None:
        try:
            await kube.delete_collection(api.api_version, namespace, api.plural, podgroup.stale_selector(uid, attempt))
        except ApiError as error:  # the job's deletion collects them anyway
            log.warning("%s/%s: deleting older PodGroups failed: %s", namespace, job.name, error)
    try:
        await kube.create(podgroup.render_podgroup(job, namespace, uid, attempt, api))
    except Refused as refused:
        return refusal.classify(refused.status, refused.message)
    return None


async def follow_min_count(kube: Kube, job: TrainingJob, namespace: str, api: podgroup.GroupApi) -> None:
    """An elastic job's PodGroup given the job's minCount, where the version lets it change (one not
    created yet is created with it)."""
    name = podgroup.podgroup_name(job, 0)
    try:
        await kube.merge_patch(api.api_version, namespace, api.plural, name, podgroup.min_count_patch(job))
    except Refused as refused:  # v1alpha2: its schedulingPolicy is immutable
        log.warning(
            "%s/%s: PodGroup %s keeps its minCount (%s cannot change it): %s",
            namespace,
            job.name,
            name,
            api.api_version,
            refused.message,
        )
