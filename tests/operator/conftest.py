"""Fixtures of the operator's control-plane tests (helpers in operator_tools.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster.controlplane import ControlPlane
from cluster.kubelet import FakeKubelet
from operator_tools import Cluster, OperatorProcess, Reaper


@pytest.fixture
def cluster(kube_api: Any, namespace: str, crds_installed: ControlPlane) -> Iterator[Cluster]:
    yield Cluster(kube_api, namespace)


@pytest.fixture
def kubelet(kube_api: Any, namespace: str) -> Iterator[FakeKubelet]:
    reaper = Reaper(kube_api, namespace)
    reaper.thread.start()
    yield FakeKubelet(kube_api)
    reaper.stop.set()
    reaper.thread.join(5)


@pytest.fixture
def operator(crds_installed: ControlPlane, namespace: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    """The operator, watching only this test's namespace."""
    proc = OperatorProcess(crds_installed.kubeconfig, tmp_path / "operator.log", namespaces=namespace)
    proc.start()
    yield proc
    proc.stop()
    log = proc.log()
    assert "Traceback" not in log, log[-5000:]
