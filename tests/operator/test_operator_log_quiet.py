"""The operator's log holds what it did, not every probe: the probes' aiohttp server logs one
access line per request at INFO, which filled a real node's operator log with the kubelet's
probes every few seconds. Debug level keeps them."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.controlplane import ControlPlane
from support.operator_process import running_operator
from support.waiting import wait_for

pytestmark = pytest.mark.cluster


@pytest.mark.parametrize(("level", "logged"), [("info", False), ("debug", True)])
def test_probes_are_not_logged_below_debug(
    crds_installed: ControlPlane, namespace: str, tmp_path: Path, level: str, logged: bool
) -> None:
    with running_operator(crds_installed.kubeconfig, tmp_path / "operator.log", namespace, log_level=level) as proc:
        assert proc.healthy() and proc.ready()  # /readyz answered before too: probes were served
        # aiohttp writes a request's access line after its response: wait for them (debug) rather
        # than race the stop; at info the same requests again leave time for any line to appear.
        if logged:
            wait_for(lambda: "GET /healthz" in proc.log() and "GET /readyz" in proc.log(), 30, "the access lines")
        else:
            assert proc.healthy() and proc.ready()
    log = proc.log()
    assert ("GET /healthz" in log and "GET /readyz" in log) is logged, log[-3000:]
