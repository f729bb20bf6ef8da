"""kube.py against a real API server: what a create answers with."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kubernetes import client, config
from support.controlplane import ControlPlane

from kubetrain.api import naming
from kubetrain.operator.kube import Kube
from kubetrain.operator.pods import PodView

pytestmark = pytest.mark.cluster


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
