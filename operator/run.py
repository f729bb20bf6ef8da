"""`kubetrain operator`: kopf in standalone mode with our handlers, probes, metrics, settings and
leader election."""

from __future__ import annotations

import asyncio
import logging
import socket
import uuid
from typing import Any

import aiohttp
import kopf
from prometheus_client import start_http_server

from kubetrain.operator import handlers, health
from kubetrain.operator.controller import Controller
from kubetrain.operator.kube import Kube, load_configuration, own_namespace
from kubetrain.operator.leader import AlwaysLeader, Elector, Leadership
from kubetrain.operator.settings import OperatorSettings

assert handlers  # imported for its kopf decorators, which register the handlers


def run_operator(settings: OperatorSettings) -> int:
    level = getattr(logging, settings.log_level.upper(), logging.INFO)
    kopf.configure(
        debug=level <= logging.DEBUG,
        verbose=level <= logging.INFO,
        quiet=level >= logging.WARNING,
        log_format=kopf.LogFormat.JSON if settings.log_format == "json" else kopf.LogFormat.PLAIN,
    )
    logging.getLogger().setLevel(level)
    # Per-request chatter shows only at debug: kopf reports every handler call ("Handler
    # 'pod_event' succeeded.") at INFO, one line per watch event (the operator logs its own
    # transitions), and the probes' aiohttp server logs every request at INFO: on a real node
    # the kubelet's probes filled the log with a line every few seconds and pushed the
    # reconcile lines out of `kubectl logs --tail`.
    chatter = level if level <= logging.DEBUG else max(level, logging.WARNING)
    logging.getLogger("kopf.objects").setLevel(chatter)
    logging.getLogger("aiohttp.access").setLevel(chatter)
    # The kubernetes client logs every request at DEBUG; kopf's own debug output is enough.
    logging.getLogger("urllib3").setLevel(max(level, logging.INFO))
    controller = Controller(settings, Kube(load_configuration(), settings.api_connections))
    if settings.metrics_port:
        start_http_server(settings.metrics_port)
    asyncio.run(_operate(settings, controller))
    return 0


log = logging.getLogger("kubetrain.operator")

# kopf's API-resource scans (kopf/_cogs/clients/scanning.py) run as tasks whose exceptions it
# never retrieves: a scan cut off by a closed connection (the operator stopping, the API server
# restarting) is then printed by asyncio, at garbage collection, as an unretrieved traceback.
KOPF_SCANS = ("_read_old_api", "_read_new_apis")


def _kopf_scan_errors(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """One warning line for a kopf API scan a connection error cut off (kopf scans again);
    everything else as asyncio reports it."""
    task, error = context.get("future"), context.get("exception")
    coro = task.get_coro() if isinstance(task, asyncio.Task) else None
    if getattr(coro, "__qualname__", "") in KOPF_SCANS and isinstance(error, aiohttp.ClientError | TimeoutError):
        log.warning("kopf's API scan %s was cut off: %s", getattr(coro, "__qualname__", ""), error)
        return
    loop.default_exception_handler(context)


async def _operate(settings: OperatorSettings, controller: Controller) -> None:
    asyncio.get_running_loop().set_exception_handler(_kopf_scan_errors)
    leadership: Leadership
    if settings.leader_elect:
        # Unique per process (client-go's hostname_uuid): a restarted container is a new
        # candidate, and two processes on one host (hostNetwork pods, tests) never share one.
        identity = f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
        namespace = settings.lease_namespace or own_namespace()
        leadership = Elector(
            controller.kube,
            namespace,
            settings.lease_name,
            identity,
            settings.lease,
            controller.lead,
            controller.follow,
        )
    else:
        leadership = AlwaysLeader(controller.lead, controller.follow)
    controller.kube.may_write = lambda: leadership.leading
    probes = await health.serve(settings.health_port, lambda: controller.synced) if settings.health_port else None
    try:
        await kopf.operator(
            # Standalone: no kopf peering objects (and no RBAC for them); leader election on a
            # Lease (operator/leader.py) decides which replica reconciles.
            standalone=True,
            clusterwide=not settings.namespaces,
            namespaces=list(settings.namespaces),
            # Every handler gets a shallow copy of this memo: the one controller (handlers.py).
            memo=kopf.Memo(controller=controller, leadership=leadership),
        )
    finally:
        if probes is not None:
            await probes.cleanup()
