"""Operator settings: flags of `kubetrain operator`, each also readable from a KUBETRAIN_* env var.

The one place the operator's defaults are written: the CLI takes its defaults from `DEFAULTS`,
and the chart passes a setting only when its user chose one (docs/operator-ha.md, "Defaults").
Nothing heavy is imported here, so the CLI can read the defaults without paying for the API
models or kopf.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RenderSettings:
    """What rendering a pod needs from the operator's configuration (operator/render.py)."""

    cluster_domain: str = "cluster.local"
    default_image: str = "kubetrain/trainer:0.1.0"
    # The image of the init container that copies kubetrain's runtime into every training pod
    # (spec.runtime.inject): the operator's own (it holds the kubetrain package). Empty: no pod
    # gets it (the chart's operator.injectRuntime false; `kubetrain run --local` loads it itself).
    runtime_image: str = "kubetrain/operator:0.1.0"


@dataclass(frozen=True)
class LeaseTiming:
    """Leader election's clock, in seconds (controller-runtime's defaults). A standby takes over
    at most `duration` after the leader's last renewal; the leader stops writing when it could
    not renew for `renew_deadline`, before anyone else may take the Lease; every candidate tries
    every `retry_period`, and the leader renews that often."""

    duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.duration:
            raise ValueError(
                "leader election needs 0 < retry period < renew deadline < lease duration, got "
                f"--leader-elect-retry-period={self.retry_period:g}, "
                f"--leader-elect-renew-deadline={self.renew_deadline:g}, "
                f"--leader-elect-lease-duration={self.duration:g}"
            )


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
    health_port: int = 8080  # /healthz (liveness) and /readyz (readiness); 0 disables both
    api_connections: int = 32  # concurrent HTTP connections to the API server
    # Jobs creating their children at once (Controller.creating). Each creates nodes + 1
    # objects at once: 8 x (4 + 1) requests keep the 32 connections busy.
    workers: int = 8
    log_format: str = "json"
    log_level: str = "info"
    # Only the holder of the Lease reconciles; off: this process always does (one replica only).
    leader_elect: bool = True
    lease_name: str = "kubetrain-operator"
    # Empty: the operator's own namespace (in a pod), else the kubeconfig context's.
    lease_namespace: str = ""
    lease: LeaseTiming = field(default_factory=LeaseTiming)


DEFAULTS = OperatorSettings()
