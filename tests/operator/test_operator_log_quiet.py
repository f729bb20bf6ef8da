"""The operator's log holds what it did, not every probe: the probes' aiohttp server logs one
access line per request at INFO, which filled a real node's operator log with the kubelet's
probes every few seconds. Debug level keeps them."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.controlplane import ControlPlane
from support.operator_process import running_operator

pytestmark = pytest.mark.cluster


@pytest.mark.parametrize(("level", "logged"), [("info", False), ("debug", True)])
def test_probes_are_not_logged_below_debug(
    crds_installed: ControlPlane, namespace: str, tmp_path: Path, level: str, logged: bool
) -> None:
    with running_operator(crds_installed.kubeconfig, tmp_path / "operator.log", namespace, log_level=level) as proc:
        assert proc.healthy() and proc.ready()  # /readyz answered before too: probes were served
    log = proc.log()
    assert ("GET /healthz" in log and "GET /readyz" in log) is logged, log[-3000:]
