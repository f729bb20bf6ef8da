"""Kube.create: which refusals of the API server fail a job for good and which are retried.
The messages are the API server's own wording (the test control plane's, where it has them)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from kubetrain.operator.kube import ApiError, Invalid, Kube, Refused

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"namespace": "ns", "name": "j-node-0"}}


def create_refused(status: int, message: str) -> dict[str, Any] | None:
    kube = Kube(configuration=None)

    async def refuse(*args: Any, **kwargs: Any) -> bytes:
        raise ApiError(status, json.dumps({"message": message}).encode())

    kube._request = refuse  # type: ignore[method-assign]
    return asyncio.run(kube.create(POD))


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (422, 'Pod "j-node-0" is invalid: spec.nodeSelector: Invalid value: "not a label value!"'),
        (403, 'pods "j-node-0" is forbidden: violates PodSecurity "restricted:latest": privileged'),
        (403, 'admission webhook "policy.example.com" denied the request: GPUs need a team label'),
    ],
)
def test_a_refused_pod_is_invalid_for_good(status: int, message: str) -> None:
    with pytest.raises(Invalid) as error:
        create_refused(status, message)
    assert str(error.value) == message  # what the job's Failed condition will say


@pytest.mark.parametrize(
    "message",
    [
        'pods "j-node-0" is forbidden: exceeded quota: compute, requested: cpu=4, used: cpu=8, limited: cpu=10',
        'pods "j-node-0" is forbidden: unable to create new content in namespace ns because it is being terminated',
        # The operator's own RBAC: its admin fixes it, and the job must still be there then.
        'pods is forbidden: User "system:serviceaccount:kubetrain-system:kubetrain" cannot create '
        'resource "pods" in API group "" in the namespace "ns"',
    ],
)
def test_a_transient_refusal_is_retried(message: str) -> None:
    with pytest.raises(Refused) as error:
        create_refused(403, message)
    assert str(error.value) == message


def test_a_server_error_is_retried() -> None:
    with pytest.raises(ApiError) as error:
        create_refused(500, "etcdserver: request timed out")
    assert error.value.status == 500


def test_an_existing_pod_is_fine() -> None:
    assert create_refused(409, 'pods "j-node-0" already exists') is None
