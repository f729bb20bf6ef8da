"""The PodGroup side of a reconcile, the I/O: which PodGroup APIs the cluster serves
(discovery, cached) and the attempt's PodGroup created. operator/podgroup.py decides what
they are; this module only asks and writes, through kube.py."""

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
                    api.api_version
                    for api in podgroup.APIS.values()
                    if await self.kube.serves(api.api_version, api.plural)
                ]
                self._served = (now, frozenset(found))
            return self._served[1]


async def create(
    kube: Kube, job: TrainingJob, namespace: str, uid: str, attempt: int, mode: podgroup.Mode
) -> refusal.Refusal | None:
    """The attempt's PodGroup, after older attempts' ones are deleted (they go with their
    attempt; the API server keeps each until its pods are gone). The refusal, if any."""
    api = podgroup.APIS[mode]
    try:
        await kube.delete_collection(api.api_version, namespace, api.plural, podgroup.stale_selector(uid, attempt))
    except ApiError as error:  # the job's deletion collects them anyway
        log.warning("%s/%s: deleting older PodGroups failed: %s", namespace, job.name, error)
    try:
        await kube.create(podgroup.render_podgroup(job, namespace, uid, attempt, mode))
    except Refused as refused:
        return refusal.classify(refused.status, refused.message)
    return None
