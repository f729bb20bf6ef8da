"""Fixtures of the operator's control-plane tests (helpers in tests/support/)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import urllib3
from kubernetes import client
from support.controlplane import ControlPlane
from support.kubelet import FakeKubelet
from support.objects import Cluster


@pytest.fixture
def cluster(kube_api: Any, namespace: str, crds_installed: ControlPlane) -> Iterator[Cluster]:
    yield Cluster(kube_api, namespace)


@pytest.fixture
def kubelet(kube_api: Any, namespace: str) -> Iterator[FakeKubelet]:
    """The FakeKubelet, plus the half of a kubelet that finishes deletions: a bound pod with a
    deletionTimestamp stays until its kubelet confirms its containers stopped. A thread does
    that for every pod of the namespace, as the operator's gang restarts and cleanups need."""
    kubelet = FakeKubelet(kube_api)
    stop = threading.Event()

    def confirm() -> None:
        while not stop.wait(0.1):
            try:
                kubelet.confirm_deletions(namespace)
            except (client.ApiException, urllib3.exceptions.HTTPError):  # refused; the API server away
                continue

    thread = threading.Thread(target=confirm, name="confirm-deletions", daemon=True)
    thread.start()
    yield kubelet
    stop.set()
    thread.join(5)
