"""Prometheus metrics of the operator (served on --metrics-port at /metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

JOBS = Gauge("kubetrain_trainingjobs", "TrainingJobs known to the operator, by phase.", ["phase"])
RESTARTS = Counter("kubetrain_gang_restarts_total", "Gang restarts, by the failure reason.", ["reason"])
FINISHED = Counter("kubetrain_trainingjobs_finished_total", "Jobs that finished, by condition reason.", ["reason"])
RECONCILE = Histogram(
    "kubetrain_reconcile_duration_seconds",
    "Wall time of one reconcile (decide and apply), API calls included.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
RECONCILE_ERRORS = Counter("kubetrain_reconcile_errors_total", "Reconciles that raised and were retried.")
TIME_TO_CREATED = Histogram(
    "kubetrain_time_to_pods_created_seconds",
    "From the TrainingJob's creationTimestamp (1 s resolution) to all pods of its first attempt created.",
    buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
)
API_WRITES = Counter("kubetrain_api_writes_total", "API writes made by the operator.", ["verb", "resource"])
LEADER = Gauge(
    "kubetrain_leader",
    "1 while this operator process leads (holds the leader Lease, or runs with --no-leader-elect), else 0.",
)
TIME_TO_FIRST_STEP = Histogram(
    "kubetrain_time_to_first_step_seconds",
    "From the TrainingJob's creationTimestamp (1 s resolution) to rank 0's first training step (status.timeline).",
    buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800),
)
RECOVERY = Histogram(
    "kubetrain_recovery_seconds",
    "From a gang failure (or a resume) to rank 0's first training step of the next attempt, by how it "
    "started: InPlace, Recreate or Resume (status.timeline).",
    ["start"],
    buckets=(0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 60, 120, 300),
)
