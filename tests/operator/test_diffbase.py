"""handlers.SlicedDiffBase builds the same essence as kopf's own storage from far less copying."""

from __future__ import annotations

from typing import Any

import kopf
import pytest

from kubetrain.api import naming
from kubetrain.operator.handlers import SlicedDiffBase

KEY = "last-handled-configuration"
POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "job-node-0",
        "namespace": "ns",
        "uid": "u1",
        "resourceVersion": "42",
        "labels": {naming.LABEL_JOB: "job"},
        "annotations": {
            "team": "vision",
            "kubectl.kubernetes.io/last-applied-configuration": "{}",
            f"{naming.GROUP}/{KEY}": '{"spec": {}}',
        },
        "ownerReferences": [{"kind": "TrainingJob", "name": "job", "uid": "j1", "controller": True}],
        "managedFields": [{"manager": "kubetrain", "fieldsV1": {"f:spec": {}}}],
    },
    "spec": {"containers": [{"name": "trainer", "image": "img", "env": [{"name": "A", "value": "1"}]}]},
    "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
}
# The one body kopf keys differently (ownerReferences and kind decide it).
REPLICA_SET: dict[str, Any] = {
    "apiVersion": "apps/v1",
    "kind": "ReplicaSet",
    "metadata": {
        "name": "rs",
        "annotations": {f"{naming.GROUP}/{KEY}-ofDRS": "{}", "keep": "me"},
        "ownerReferences": [{"kind": "Deployment", "name": "d", "uid": "d1"}],
    },
    "spec": {"replicas": 2},
}
BARE: dict[str, Any] = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "svc"}, "spec": {}}


@pytest.mark.parametrize("body", [POD, REPLICA_SET, BARE], ids=["pod", "replicaset-of-deployment", "bare"])
def test_sliced_essence_equals_kopfs(body: dict[str, Any]) -> None:
    kopfs = kopf.AnnotationsDiffBaseStorage(prefix=naming.GROUP, key=KEY)
    sliced = SlicedDiffBase(prefix=naming.GROUP, key=KEY)
    assert sliced.build(body=kopf.Body(body)) == kopfs.build(body=kopf.Body(body))


def test_extra_fields_build_from_the_whole_body() -> None:
    sliced = SlicedDiffBase(prefix=naming.GROUP, key=KEY)
    essence = sliced.build(body=kopf.Body(POD), extra_fields=[("status", "phase")])
    assert essence["status"] == {"phase": "Running"}
