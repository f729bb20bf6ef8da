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
    # kopf reports every handler call ("Handler 'pod_event' succeeded.") at INFO: one line
    # per watch event. The operator logs its own transitions; kopf's go to DEBUG only.
    logging.getLogger("kopf.objects").setLevel(max(level, logging.WARNING) if level > logging.DEBUG else level)
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
