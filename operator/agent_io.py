"""The operator's orders to a gang's torchrun agents: the fast path of the in-place restart.

The decision (status.decide) to restart a gang in place is applied two ways at once:
- the pods are relabelled to the next attempt (kube.move_pod): the record of the move, and
  through the downward API file the agents' fallback;
- each pod's agent is ordered the next attempt directly, by a POST to its agent port over the
  pod network (here). The kubelet refreshes a downward API file on its own schedule, which no
  Kubernetes release bounds (seen here: more than 60 s), so the file alone cannot carry a
  recovery meant to take a second.

An order is signed with the job's agent token (HMAC, api/contract.order_signature): a Secret the
operator creates before the job's first pods, which the pods read as an env var; the agents take
no order without it, so nothing but the operator (and whoever may read the job's Secrets) can
move a gang. One agent reached is enough: it relays the attempt to the others through their
rendezvous store (trainer/agent.py).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import secrets
from collections.abc import Sequence

import aiohttp

from kubetrain.api import naming
from kubetrain.api.contract import AGENT_TOKEN_KEY, ORDER_PATH, order_signature
from kubetrain.api.models import TrainingJob
from kubetrain.operator.kube import ApiError, Kube, Refused
from kubetrain.operator.render import render_agent_secret

log = logging.getLogger("kubetrain.operator")

TOKEN_BYTES = 32
# An order is a few hundred bytes to a pod the operator can reach: a try that takes longer is
# lost (the pod's network, a dead agent), and the next one goes. The attempt file stays the
# fallback for a pod no try reached.
ORDER_TIMEOUT_S = 1.0
ORDER_TRIES = 3
ORDER_BACKOFF_S = 0.2


async def ensure_token(kube: Kube, job: TrainingJob, namespace: str, uid: str) -> str | None:
    """The job's agent token: its Secret created now, or read if it exists. None when neither can
    be done (an operator without the RBAC for Secrets): the agents then follow their attempt
    files alone, and the in-place restart waits on the kubelet."""
    token = secrets.token_hex(TOKEN_BYTES)
    try:
        created = await kube.create(render_agent_secret(job, namespace, uid, token))
        if created is not None:
            return token
        found = await kube.get_secret(namespace, naming.agent_secret_name(job.name))
    except (Refused, ApiError) as error:
        log.warning(
            "%s/%s: the agent token Secret cannot be created or read (%s): in-place restarts wait on the "
            "kubelet's refresh of each pod's attempt file",
            namespace,
            job.name,
            error,
        )
        return None
    value = ((found or {}).get("data") or {}).get(AGENT_TOKEN_KEY)
    return base64.b64decode(value).decode() if value else None


async def order(targets: Sequence[tuple[str, str | None]], port: int, token: str, attempt: int) -> dict[str, str]:
    """Order `attempt` to each (pod, ip)'s agent, all at once: pod -> what happened ("ordered", or
    why not). Returns within ORDER_TRIES tries of ORDER_TIMEOUT_S each."""
    body = json.dumps({"attempt": attempt, "signature": order_signature(token, attempt)})
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
