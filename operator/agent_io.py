"""The operator's orders to a gang's torchrun agents: the fast path of the in-place restart.

The decision (status.decide) to restart a gang in place is applied two ways at once:
- the pods are relabelled to the next attempt (kube.move_pod): the record of the move, and
  through the downward API file the agents' fallback;
- each pod's agent is ordered the next attempt directly, by a POST to its agent port over the
  pod network (here). The kubelet refreshes a downward API file on its own schedule, which no
  Kubernetes release bounds (seen in CI: more than 60 s), so the file alone cannot carry a
  recovery meant to take a second.

An order is signed with the job's agent token (HMAC, api/contract.order_signature), which the
pods read from a Secret the operator creates before the job's first pods. The token is derived
from the operator's key (KUBETRAIN_AGENT_KEY, the chart's `<release>-agent-key` Secret) and the
job's uid: every replica, and an operator restarted, signs alike, and the operator needs no
permission to read Secrets. The agents take no unsigned order, so nothing but the operator (and
whoever may read the job's Secrets) can move a gang. One agent reached is enough: it relays the
attempt to the others through their rendezvous store (runtime/agent/inplace.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import os
import secrets
from collections.abc import Sequence

import aiohttp

from kubetrain.api.contract import ORDER_PATH, order_signature
from kubetrain.api.models import TrainingJob
from kubetrain.operator.kube import ApiError, Kube, Refused
from kubetrain.operator.render import render_agent_secret

log = logging.getLogger("kubetrain.operator")

AGENT_KEY_ENV = "KUBETRAIN_AGENT_KEY"
KEY_BYTES = 32
# An order is a few hundred bytes to a pod the operator can reach: a try that takes longer is
# lost (the pod's network, a dead agent), and the next one goes. The attempt file stays the
# fallback for a pod no try reached.
ORDER_TIMEOUT_S = 1.0
ORDER_TRIES = 3
ORDER_BACKOFF_S = 0.2


def operator_key() -> bytes:
    """The operator's key, from its environment. Without one (an operator started by hand) a
    random key of this process: jobs it starts restart in place as fast, but after a restart of
    the operator their orders are refused and the agents fall back to their attempt files."""
    key = os.environ.get(AGENT_KEY_ENV, "")
    if key:
        return key.encode()
    log.warning(
        "%s is not set: in-place restarts of jobs started before this operator process fall back to the "
        "pods' attempt files (the chart sets it)",
        AGENT_KEY_ENV,
    )
    return secrets.token_bytes(KEY_BYTES)


def job_token(key: bytes, namespace: str, uid: str) -> str:
    return hmac.new(key, f"{namespace}/{uid}".encode(), hashlib.sha256).hexdigest()


async def ensure_secret(kube: Kube, job: TrainingJob, namespace: str, uid: str, token: str) -> bool:
    """The job's agent token Secret, created unless it exists: whether the pods will have a token.
    False where it cannot be created (an operator without the RBAC for it): the agents then
    follow their attempt files alone, and the in-place restart waits on the kubelet."""
    try:
        await kube.create(render_agent_secret(job, namespace, uid, token))
    except (Refused, ApiError) as error:
        log.warning(
            "%s/%s: the agent token Secret cannot be created (%s): in-place restarts wait on the kubelet's "
            "refresh of each pod's attempt file",
            namespace,
            job.name,
            error,
        )
        return False
    return True


async def order(
    targets: Sequence[tuple[str, str | None]],
    port: int,
    token: str,
    attempt: int,
    members: Sequence[int] | None = None,
) -> dict[str, str]:
    """Order `attempt` (with an elastic gang's `members`) to each (pod, ip)'s agent, all at once: pod ->
    what happened ("ordered", or why not). Returns within ORDER_TRIES tries of ORDER_TIMEOUT_S each."""
    order: dict[str, object] = {"attempt": attempt, "signature": order_signature(token, attempt, members)}
    if members is not None:
        order["members"] = list(members)
    body = json.dumps(order)
    timeout = aiohttp.ClientTimeout(total=ORDER_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        outcomes = await asyncio.gather(*(_order_one(session, ip, port, body) for _, ip in targets))
    return {pod: outcome for (pod, _), outcome in zip(targets, outcomes, strict=True)}


async def _order_one(session: aiohttp.ClientSession, ip: str | None, port: int, body: str) -> str:
    if not ip:
        return "the pod has no IP yet"
    host = f"[{ip}]" if ":" in ip else ip
    url = f"http://{host}:{port}{ORDER_PATH}"
    outcome = ""
    for attempt in range(ORDER_TRIES):
        if attempt:
            await asyncio.sleep(ORDER_BACKOFF_S)
        try:
            async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as response:
                text = (await response.text())[:200]
                if response.status == 202:
                    return "ordered"
                outcome = f"{url} answered {response.status}: {text}"
                if response.status in (400, 403, 404):  # another try would get the same answer
                    return outcome
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            outcome = f"{url}: {type(error).__name__} {error}".strip()
    return outcome
