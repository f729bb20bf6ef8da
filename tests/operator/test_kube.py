"""Kube.create: a refusal (403, 422) is raised with the API server's status and message for
`refusal.classify`; an existing object is fine; anything else is an error to retry (what a
real API server answers: test_kube_cluster.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from kubetrain.operator.kube import ApiError, Kube, Refused

pytestmark = pytest.mark.unit

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
        (
            403,
            'pods "j-node-0" is forbidden: error looking up service account ns/trainer: '
            'serviceaccount "trainer" not found',
        ),
    ],
)
def test_a_refusal_carries_the_status_and_the_servers_words(status: int, message: str) -> None:
    with pytest.raises(Refused) as error:
        create_refused(status, message)
    assert (error.value.status, error.value.message) == (status, message)


def test_a_server_error_is_retried() -> None:
    with pytest.raises(ApiError) as error:
        create_refused(500, "etcdserver: request timed out")
    assert error.value.status == 500


def test_an_existing_pod_is_fine() -> None:
    assert create_refused(409, 'pods "j-node-0" already exists') is None


@pytest.mark.parametrize(
    ("body", "gone"),
    [
        (b"unable to retrieve container logs for containerd://2dfbfdbbb8d6343290f607fe48ed2106d33\n", True),
        (b"unable to retrieve container logs for containerd://e788ff6eb312", True),
        (b'{"event": "step", "step": 3}\nunable to retrieve container logs for containerd://e7\n', False),
        (b"", False),
    ],
)
def test_the_kubelets_200_for_a_removed_container_is_no_log(body: bytes, gone: bool) -> None:
    """The kubelet sends a log's headers before it asks the runtime for the container: for one it
    has removed (a deleted pod's, once stopped) the answer is 200 with one line saying so."""
    kube = Kube(configuration=None)

    async def answer(*args: Any, **kwargs: Any) -> bytes:
        return body

    kube._request = answer  # type: ignore[method-assign]
    if gone:
        with pytest.raises(ApiError) as error:
            asyncio.run(kube.read_log("ns", "j-node-0", 100))
        assert error.value.status == 410 and "unable to retrieve container logs" in str(error.value)
    else:
        assert asyncio.run(kube.read_log("ns", "j-node-0", 100)) == body.decode()
