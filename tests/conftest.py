"""Shared fixtures. `control_plane` is a real etcd + kube-apiserver + kube-controller-manager
on 127.0.0.1 (see tests/support/controlplane.py), started once per session.

Where the binaries are missing the tests that need them are skipped, naming what is missing.
With KUBETRAIN_REQUIRE_CONTROL_PLANE=1 (set by .ci/run) that skip is a failure instead, and
so is any other skip of a test marked `cluster`: CI cannot pass by skipping them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import controlplane
from support.controlplane import ControlPlane, Unavailable
from support.objects import release_pods
from support.waiting import wait_for

REQUIRE_ENV = "KUBETRAIN_REQUIRE_CONTROL_PLANE"
ROOT = Path(__file__).resolve().parent.parent


def control_plane_required() -> bool:
    return os.environ.get(REQUIRE_ENV) == "1"


def unavailable(reason: str) -> None:
    """Skip, or fail when CI requires the control plane."""
    if control_plane_required():
        pytest.fail(f"control plane required ({REQUIRE_ENV}=1) but unavailable: {reason}", pytrace=False)
    pytest.skip(f"control plane unavailable: {reason}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if (
        report.skipped
        and control_plane_required()
        and item.get_closest_marker("cluster") is not None
        and not hasattr(report, "wasxfail")
    ):
        report.outcome = "failed"
        report.longrepr = f"{REQUIRE_ENV}=1 but a cluster test was skipped: {report.longrepr}"


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """A running control plane. Attributes: `kubeconfig` (admin, system:masters), `server`,
    `workdir`, `logs`; methods: `api_client()` (a new kubernetes ApiClient), `kubectl(*args,
    input=None, check=True)`, `helm(...)`. KUBECONFIG points at it for the session."""
    try:
        bin_dir = controlplane.find_k8s_bin()
    except Unavailable as exc:
        unavailable(str(exc))
    cp = controlplane.start(bin_dir=bin_dir)
    print(f"\ncontrol plane at {cp.server} ready in {cp.timings['ready']:.1f} s; logs in {cp.logs}")
    previous = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = str(cp.kubeconfig)
    try:
        yield cp
    finally:
        if previous is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = previous
        cp.stop()


@pytest.fixture(scope="session")
def kube_api(control_plane: ControlPlane) -> Iterator[Any]:
    """One kubernetes ApiClient shared by the session."""
    with control_plane.api_client() as api:
        yield api


@pytest.fixture(scope="session")
def crds_installed(control_plane: ControlPlane) -> ControlPlane:
    """crds/ applied and Established."""
    controlplane.install_crds(control_plane, ROOT / "crds")
    return control_plane


@pytest.fixture
def namespace(control_plane: ControlPlane, kube_api: Any, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace per test whose `default` ServiceAccount exists (pods need it);
    deleted afterwards without waiting, its pods first with grace 0: pods bound to the tests'
    fake nodes have no kubelet to confirm a graceful deletion, and would keep the namespace
    Terminating for the rest of the session."""
    from kubernetes import client

    core = client.CoreV1Api(kube_api)
    stem = request.node.name.lower().replace("_", "-")
    name = "".join(c for c in stem if c.isalnum() or c == "-")[:40].strip("-") + "-" + uuid.uuid4().hex[:6]
    core.create_namespace({"metadata": {"name": name}})

    def has_sa() -> bool:
        try:
            core.read_namespaced_service_account("default", name)
        except client.ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    wait_for(has_sa, 30, f"the default ServiceAccount in {name}")
    yield name
    core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    release_pods(core, name)  # the operator that would has stopped with its test
    core.delete_namespace(name)
