"""The client's options and the kubernetes backend's pure parts: which namespace, and what an
API server's refusal says (the refusals themselves are the cluster tests')."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client import ApiException

from kubetrain.client import Client, ClientError
from kubetrain.client.kube import default_namespace, server_message

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("backend", "options", "says"),
    [
        ("kubernetes", {"run_dir": "runs"}, r"run_dir: only the local backend has one"),
        ("local", {"namespace": "a"}, r"namespace, kubeconfig: the local backend has none"),
        ("slurm", {}, r"backend: 'slurm' is not one of 'kubernetes', 'local'"),
    ],
)
def test_options_that_do_not_fit_the_backend_are_refused(backend: Any, options: dict[str, Any], says: str) -> None:
    with pytest.raises(ClientError, match=says):
        Client(backend, **options)


def kubeconfig(path: Path, namespace: str | None) -> Path:
    context: dict[str, Any] = {"cluster": "c", "user": "u"}
    if namespace:
        context["namespace"] = namespace
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "ctx", "context": context}],
        "current-context": "ctx",
    }
    path.write_text(yaml.safe_dump(document))
    return path


def test_the_namespace_is_the_contexts_as_kubectl_chooses_it(tmp_path: Path) -> None:
    assert default_namespace(kubeconfig(tmp_path / "a", "team-a")) == "team-a"
    assert default_namespace(kubeconfig(tmp_path / "b", None)) == "default"
    assert Client(kubeconfig=kubeconfig(tmp_path / "c", "team-c")).namespace == "team-c"
    assert Client(namespace="mine", kubeconfig=kubeconfig(tmp_path / "d", "team-d")).namespace == "mine"


def test_a_refusal_carries_the_servers_own_message() -> None:
    refused = ApiException(status=422, reason="Unprocessable Entity")
    refused.body = json.dumps({"kind": "Status", "message": 'TrainingJob.kubetrain.dev "x" is invalid: spec.nodes'})
    assert server_message(refused) == 'TrainingJob.kubetrain.dev "x" is invalid: spec.nodes'
    assert server_message(ApiException(status=503, reason="Service Unavailable")) == "503 Service Unavailable"
