"""A pod with spec.template's init containers, read back by the operator: a sidecar that
cannot start must look stuck (the trainer only waits in PodInitializing behind it)."""

from __future__ import annotations

from typing import Any

import pytest
from support.jobs import job_model

from kubetrain.operator.pods import PodView
from kubetrain.operator.render import render_pod

pytestmark = pytest.mark.unit

SIDECAR = {"name": "log-shipper", "image": "fluent-bit:3", "restartPolicy": "Always"}


def waiting(name: str, reason: str) -> dict[str, Any]:
    return {"name": name, "state": {"waiting": {"reason": reason}}}


@pytest.mark.parametrize(
    ("init_reason", "trainer_reason", "seen"),
    [
        ("ImagePullBackOff", "PodInitializing", "ImagePullBackOff"),
        ("ErrImagePull", "PodInitializing", "ErrImagePull"),
        ("PodInitializing", "PodInitializing", "PodInitializing"),  # starting, not stuck
        ("ImagePullBackOff", "CrashLoopBackOff", "CrashLoopBackOff"),  # the trainer's own reason first
    ],
)
def test_a_stuck_init_container_is_the_pods_waiting_reason(init_reason: str, trainer_reason: str, seen: str) -> None:
    job = job_model(template={"spec": {"initContainers": [SIDECAR]}})
    pod = render_pod(job, "ns", "uid", 0, 0)
    pod["status"] = {
        "phase": "Pending",
        "initContainerStatuses": [waiting("log-shipper", init_reason)],
        "containerStatuses": [waiting("trainer", trainer_reason)],
    }
    assert PodView.from_pod(pod).waiting_reason == seen


def test_a_failed_init_container_is_the_pods_failure_with_its_message() -> None:
    """kubetrain's runtime init container (or a template's) that exits non-zero: the trainer never
    ran, and status.failures says which container ended how, with its last log lines."""
    from datetime import UTC, datetime

    from kubetrain.operator.failures import failure_of

    pod = render_pod(job_model(), "ns", "uid", 1, 0)
    done = {"exitCode": 1, "reason": "Error", "message": "PermissionError: [Errno 1] Operation not permitted"}
    pod["status"] = {
        "phase": "Failed",
        "initContainerStatuses": [{"name": "kubetrain-runtime", "state": {"terminated": done}}],
        "containerStatuses": [waiting("trainer", "PodInitializing")],
    }
    failure = failure_of(PodView.from_pod(pod), 0, "failed", datetime(2026, 11, 29, tzinfo=UTC))
    assert (failure.reason, failure.exit_code, failure.pod) == ("InitContainerFailed", None, "valid-job-node-1")
    assert (
        failure.message
        == "init container kubetrain-runtime exited 1: PermissionError: [Errno 1] Operation not permitted"
    )
