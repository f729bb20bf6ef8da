"""Kube.create: a refusal (403, 422) is raised with the API server's status and message for
`refusal.classify`; an existing object is fine; anything else is an error to retry; a real
API server answers with the new object's metadata only."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from kubernetes import client, config
from support.controlplane import ControlPlane

from kubetrain.api import naming
from kubetrain.operator.kube import ApiError, Kube, Refused
from kubetrain.operator.pods import PodView

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


@pytest.mark.cluster
def test_a_create_answers_with_the_metadata_the_expectations_read(control_plane: ControlPlane, namespace: str) -> None:
    """The API server honours the metadata-only reply on a create, and it holds all that the
    controller's expectations need of the new pod."""
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(control_plane.kubeconfig), client_configuration=configuration)  # type: ignore[no-untyped-call]
    labels = {naming.LABEL_JOB: "j", naming.LABEL_JOB_UID: "job-uid", naming.LABEL_NODE_RANK: "1"}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": namespace, "name": "j-node-1", "labels": labels},
        "spec": {"containers": [{"name": naming.CONTAINER_NAME, "image": "kubetrain/trainer:test"}]},
    }

    async def create() -> dict[str, Any] | None:
        kube = Kube(configuration)
        try:
            return await kube.create(pod)
        finally:
            await kube.close()

    created = asyncio.run(create())
    assert created is not None and created["kind"] == "PartialObjectMetadata" and "spec" not in created
    view = PodView.from_pod(created)
    assert (view.name, view.job_uid, view.rank, view.phase, view.node) == ("j-node-1", "job-uid", 1, "Pending", None)
    assert view.uid and view.created is not None
