"""Operator settings: flags of `kubetrain operator`, each also readable from a KUBETRAIN_* env var."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from kubetrain.operator.render import RenderSettings
from kubetrain.operator.status import Policy


@dataclass(frozen=True)
class OperatorSettings:
    # Empty: every namespace (cluster-wide watch). Otherwise only these (kopf accepts globs).
    namespaces: tuple[str, ...] = ()
    render: RenderSettings = field(default_factory=RenderSettings)
    stuck_timeout_seconds: float = 300.0
    straggler_timeout_seconds: float = 90.0
    # How often rank 0's log is read for status.progress while a job runs.
    progress_interval_seconds: float = 15.0
    progress_tail_lines: int = 200
    metrics_port: int = 8000  # 0 disables the Prometheus endpoint
    health_port: int = 8080  # 0 disables kopf's liveness endpoint (/healthz)
    api_connections: int = 32  # concurrent HTTP connections to the API server
    # Jobs creating their children at once (Controller.creating). Each creates nodes + 1
    # objects at once: 8 x (4 + 1) requests keep the 32 connections busy.
    workers: int = 8
    log_format: str = "json"

    @property
    def policy(self) -> Policy:
        return Policy(
            stuck_timeout=timedelta(seconds=self.stuck_timeout_seconds),
            straggler_timeout=timedelta(seconds=self.straggler_timeout_seconds),
        )
