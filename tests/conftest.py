"""Shared fixtures. `control_plane` is a real etcd + kube-apiserver + kube-controller-manager
on 127.0.0.1 (see tests/support/controlplane.py), started once per session; `s3_server` a real
S3 server (SeaweedFS, tests/support/s3server.py), also once per session, and `s3_bucket` a fresh
bucket of it per test.

Every test has exactly one tier (tests/support/tiers.py, a plugin registered here). Where the binaries are
missing the tests that need them are skipped, naming what is missing. With
KUBETRAIN_REQUIRE_CONTROL_PLANE=1 (set by .ci/run) that skip is a failure instead, and so is
any other skip of a test of a tier above `unit` and `train` (those may skip, naming a GPU or
root): CI cannot pass by skipping them. A module may name its own variable in REQUIRE_ENV (the
kind scenario: KUBETRAIN_REQUIRE_E2E, which only GitHub's e2e workflow can satisfy).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from support import controlplane, leftovers, s3server, tiers, tools, worker_groups
from support.controlplane import ControlPlane
from support.objects import release_pods
from support.operator_process import OperatorProcess, running_operator
from support.s3server import Bucket, S3Server
from support.tiers import tiers_of
from support.waiting import wait_for

if TYPE_CHECKING:
    from support.processnode import ProcessNode  # imports kubernetes: 0.8 s no unit test needs

REQUIRE_ENV = "KUBETRAIN_REQUIRE_CONTROL_PLANE"
ROOT = Path(__file__).resolve().parent.parent


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(tiers, "kubetrain-tiers")
    config.pluginmanager.register(leftovers, "kubetrain-leftovers")
    config.pluginmanager.register(worker_groups, "kubetrain-worker-groups")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    required = getattr(getattr(item, "module", None), "REQUIRE_ENV", REQUIRE_ENV)
    if (
        report.skipped
        and os.environ.get(required) == "1"
        and not set(tiers_of(item)) <= tiers.MACHINE_TIERS
        and not hasattr(report, "wasxfail")
    ):
        report.outcome = "failed"
        report.longrepr = f"{required}=1 but a {'/'.join(tiers_of(item))} test was skipped: {report.longrepr}"


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """A running control plane. Attributes: `kubeconfig` (admin, system:masters), `server`,
    `workdir`, `logs`; methods: `api_client()` (a new kubernetes ApiClient), `kubectl(*args,
    input=None, check=True)`, `helm(...)`. KUBECONFIG points at it for the session."""
    with tools.control_plane() as cp, pytest.MonkeyPatch.context() as env:
        print(f"\ncontrol plane at {cp.server} ready in {cp.timings['ready']:.1f} s; logs in {cp.logs}")
        env.setenv("KUBECONFIG", str(cp.kubeconfig))
        yield cp


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """A running S3 server (SeaweedFS on 127.0.0.1, support.s3server; `endpoint`, `env()`,
    `store(bucket)`, `create_bucket(name)`). One per session (per xdist worker, started by the
    first test that asks): a start costs 3.3 s (7 s a third of the time) and a stop 1 s, tests
    keep apart by buckets (`s3_bucket`), and a test that stops or breaks a server starts its
    own (`with S3Server() as server:`)."""
    try:
        server = S3Server()
    except controlplane.Unavailable as exc:
        tools.missing_tool(f"S3 server unavailable: {exc}")
    with server:
        print(f"\nS3 server at {server.endpoint} ready in {server.timings['ready']:.1f} s; log in {server.log}")
        yield server


@pytest.fixture
def s3_bucket(s3_server: S3Server, request: pytest.FixtureRequest) -> Iterator[Bucket]:
    """A fresh bucket named after the test (`name`, `url` s3://name/checkpoints, `store()`,
    `server`), deleted with what it holds afterwards. The environment is left alone: code that
    reads credentials from it needs `server.env()` there, or obstore asks the EC2 metadata
    service (169.254.169.254) for them."""
    bucket = Bucket(s3_server, s3_server.create_bucket(s3server.unique_bucket_name(request.node.name)))
    yield bucket
    s3_server.delete_bucket(bucket.name)


@pytest.fixture(scope="module")
def kube_api(control_plane: ControlPlane) -> Iterator[Any]:
    """One kubernetes ApiClient shared by the module's tests. Per module, as `crds_installed`: a
    module with a control plane of its own (a module-scoped `control_plane`: test_faults_cluster,
    test_kueue_cluster) gets them for that one."""
    with control_plane.api_client() as api:
        yield api


@pytest.fixture(scope="module")
def crds_installed(control_plane: ControlPlane) -> ControlPlane:
    """crds/ applied and Established (applying them again is a no-op)."""
    return controlplane.install_crds(control_plane, ROOT / "crds")


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


@pytest.fixture
def start_operator(
    crds_installed: ControlPlane, namespace: str, tmp_path: Path
) -> Iterator[Callable[..., OperatorProcess]]:
    """Starts the operator (`kubetrain operator` in a subprocess) with the test's flags
    (OperatorProcess's), watching only this test's namespace; each one started is stopped when
    the test ends and its log checked clean (support.operator_process.running_operator)."""
    with contextlib.ExitStack() as started:

        def start(**flags: Any) -> OperatorProcess:
            log = tmp_path / "operator.log"
            return started.enter_context(running_operator(crds_installed.kubeconfig, log, namespace, **flags))

        yield start


@pytest.fixture
def operator(start_operator: Callable[..., OperatorProcess]) -> OperatorProcess:
    """The operator with its test defaults (start_operator)."""
    return start_operator()


@pytest.fixture
def process_node(crds_installed: ControlPlane, namespace: str, tmp_path: Path) -> Iterator[ProcessNode]:
    """The process node (support.processnode) running this test's pods as local processes;
    checked to have met no error when it has stopped."""
    from support.processnode import ProcessNode

    with ProcessNode(crds_installed.api_client, namespaces=[namespace], workdir=tmp_path / "node") as node:
        yield node
    assert node.errors == []
