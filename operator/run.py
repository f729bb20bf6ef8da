"""`kubetrain operator`: kopf in standalone mode with our handlers, metrics and settings."""

from __future__ import annotations

import asyncio
import logging

from kubetrain.operator.settings import OperatorSettings


def run_operator(settings: OperatorSettings, log_level: str = "info") -> int:
    import kopf
    from prometheus_client import start_http_server

    from kubetrain.operator import handlers  # noqa: F401  (registers the kopf handlers)
    from kubetrain.operator.controller import Controller
    from kubetrain.operator.kube import Kube, load_configuration

    level = getattr(logging, log_level.upper(), logging.INFO)
    kopf.configure(
        debug=level <= logging.DEBUG,
        verbose=level <= logging.INFO,
        quiet=level >= logging.WARNING,
        log_format=kopf.LogFormat.JSON if settings.log_format == "json" else kopf.LogFormat.PLAIN,
    )
    logging.getLogger().setLevel(level)
    # Per-request chatter shows only at debug: kopf reports every handler call ("Handler
    # 'pod_event' succeeded.") at INFO, one line per watch event (the operator logs its own
    # transitions), and kopf's liveness endpoint is an aiohttp server that logs every request
    # at INFO: on a real node the kubelet's probes filled the log with a line every few seconds
    # and pushed the reconcile lines out of `kubectl logs --tail`.
    chatter = level if level <= logging.DEBUG else max(level, logging.WARNING)
    logging.getLogger("kopf.objects").setLevel(chatter)
    logging.getLogger("aiohttp.access").setLevel(chatter)
    # The kubernetes client logs every request at DEBUG; kopf's own debug output is enough.
    logging.getLogger("urllib3").setLevel(max(level, logging.INFO))
    controller = Controller(settings, Kube(load_configuration(), settings.api_connections))
    if settings.metrics_port:
        start_http_server(settings.metrics_port)
    asyncio.run(
        kopf.operator(
            # Standalone: no kopf peering objects (and no RBAC for them); one replica only.
            standalone=True,
            clusterwide=not settings.namespaces,
            namespaces=list(settings.namespaces),
            liveness_endpoint=f"http://0.0.0.0:{settings.health_port}/healthz" if settings.health_port else None,
            # Every handler gets a shallow copy of this memo: the one controller (handlers.py).
            memo=kopf.Memo(controller=controller),
        )
    )
    return 0
