"""The PodGroups the operator writes, checked against Kubernetes' own schema of each version it
may write: scheduling.k8s.io/v1beta1 as 1.37 serves it (the tests' control plane) and v1alpha2 as
1.36 did (tests/support/podgroup_schemas.py, each vendored from a live apiserver)."""

from __future__ import annotations

from typing import Any

import fastjsonschema
import pytest
from support.controlplane import pinned
from support.jobs import job_model
from support.podgroup_schemas import SCHEMAS, check_spec, load

from kubetrain.api.models import TrainingJob
from kubetrain.operator import podgroup

pytestmark = pytest.mark.unit

ELASTIC = {"elastic": {"minNodes": 2}, "command": ["python", "train.py"]}


def jobs() -> dict[str, TrainingJob]:
    return {"fixed": job_model("j", nodes=4), "elastic": job_model("j", nodes=4, **ELASTIC)}


@pytest.mark.parametrize("api", podgroup.NATIVE_VERSIONS, ids=lambda api: api.version)
@pytest.mark.parametrize("kind", ["fixed", "elastic"])
def test_the_rendered_podgroup_is_valid_in_its_version(api: podgroup.GroupApi, kind: str) -> None:
    group = podgroup.render_podgroup(jobs()[kind], "ns", "uid", 3, api)
    assert group["apiVersion"] == api.api_version
    check_spec(api.api_version, group["spec"])
    check_spec(api.api_version, podgroup.min_count_patch(jobs()[kind])["spec"])


@pytest.mark.parametrize(
    ("written", "read"), [(podgroup.NATIVE_BETA, podgroup.NATIVE_ALPHA), (podgroup.NATIVE_ALPHA, podgroup.NATIVE_BETA)]
)
def test_a_podgroup_of_one_version_is_refused_by_the_other(written: podgroup.GroupApi, read: podgroup.GroupApi) -> None:
    """The disruption mode changed shape (v1alpha2's string "PodGroup", v1beta1's union {all: {}}):
    writing one version's spec to the other is what the schemas catch."""
    spec: dict[str, Any] = podgroup.render_podgroup(jobs()["fixed"], "ns", "uid", 0, written)["spec"]
    with pytest.raises(fastjsonschema.JsonSchemaValueException, match="disruptionMode"):
        check_spec(read.api_version, spec)


@pytest.mark.parametrize("api", podgroup.NATIVE_VERSIONS, ids=lambda api: api.version)
def test_min_count_is_followed_only_where_kubernetes_lets_it_change(api: podgroup.GroupApi) -> None:
    immutable = load(api.api_version)["schedulingPolicyImmutable"]
    assert (api.api_version in podgroup.MUTABLE_MIN_COUNT) is not immutable


def test_the_v1beta1_schema_is_the_control_planes_version() -> None:
    """The 1.37 snapshot is what the cluster tests' apiserver serves (test_gang_cluster.py compares
    it with the live one); the 1.36 one is the version behind, which 1.37 no longer serves."""
    versions = {api_version: version for api_version, version in SCHEMAS}
    assert versions[podgroup.NATIVE_BETA.api_version] == pinned("K8S_VERSION")
    for (api_version, version), path in SCHEMAS.items():
        assert load(api_version)["kubernetesVersion"] == version and path.exists()
