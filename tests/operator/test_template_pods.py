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
