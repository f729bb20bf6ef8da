"""The operator's log holds what it did, not every liveness probe: kopf's /healthz is an
aiohttp server whose access log (one line per request at INFO) filled a real node's operator
log with the kubelet's probes every few seconds. Debug level keeps them."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.controlplane import ControlPlane
from support.operator_process import OperatorProcess

pytestmark = pytest.mark.cluster


@pytest.mark.parametrize(("level", "logged"), [("info", False), ("debug", True)])
def test_probes_are_not_logged_below_debug(
    crds_installed: ControlPlane, namespace: str, tmp_path: Path, level: str, logged: bool
) -> None:
    proc = OperatorProcess(crds_installed.kubeconfig, tmp_path / "operator.log", namespaces=namespace, log_level=level)
    proc.start()  # waits until /healthz answers: at least one probe was served
    try:
        assert proc.healthy()
    finally:
        proc.stop()
    assert ("GET /healthz" in proc.log()) is logged, proc.log()[-3000:]
