"""The Helm chart rendered by helm (install.sh builds it, hence the cluster tier; no API server):
lint, render with default and non-default values, schema rejections, least-privilege RBAC, the
restricted pod, high availability (replicas, Lease, probes, PDB), the operator's defaults written
once, the CRD left out of the templates. Its values file and CRD copy without helm:
test_chart_values.py; installed on a control plane: test_chart_cluster.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.tools import (
    CHART,
    CLUSTER_ONLY_RULES,
    NAMESPACED_RULES,
    RELEASE_NAMESPACE,
    helm,
    render,
    rules_of,
    set_args,
)

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm-home")


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def container_env(deployment: dict[str, Any]) -> dict[str, str]:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value") for e in container["env"]}


NODE_TERM = (
    "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0]"
)
# Values a user might really set, each with what it must change in the output.
NON_DEFAULT: dict[str, dict[str, str]] = {
    "namespaced": {"operator.watchNamespaces": "{team-a,team-b}"},
    "pinned-image": {"image.digest": "sha256:" + "ab" * 32, "image.pullPolicy": "Always"},
    "servicemonitor": {"metrics.serviceMonitor.enabled": "true", "metrics.serviceMonitor.labels.release": "prom"},
    "no-metrics": {"metrics.enabled": "false"},
    "external-rbac": {"rbac.create": "false", "serviceAccount.create": "false", "serviceAccount.name": "ops"},
    "one-unelected": {"replicaCount": "1", "leaderElection.enabled": "false"},
    "tuned": {
        "operator.trainerImage": "registry.example/kubetrain/trainer:0.1.0-cpu",
        "operator.clusterDomain": "corp.internal",
        "operator.logLevel": "debug",
        "operator.logFormat": "plain",
        "operator.stuckTimeoutSeconds": "600",
        "operator.progressIntervalSeconds": "5",
        "leaderElection.leaseDurationSeconds": "30",
        "leaderElection.renewDeadlineSeconds": "20",
        "leaderElection.retryPeriodSeconds": "4",
        f"{NODE_TERM}.key": "pool",
        f"{NODE_TERM}.operator": "Exists",
        "replicaCount": "0",
        "fullnameOverride": "kubetrain",
        "tolerations[0].key": "dedicated",
        "tolerations[0].operator": "Exists",
    },
}


@pytest.mark.parametrize("values", [{}, *NON_DEFAULT.values()], ids=["default", *NON_DEFAULT])
def test_lint_strict(home: Path, values: dict[str, str]) -> None:
    result = helm("lint", "--strict", str(CHART), *set_args(values), home=home)
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


def test_default_render(home: Path) -> None:
    docs = render(home)
    assert sorted(doc["kind"] for doc in docs) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "PodDisruptionBudget",
        "Role",
        "RoleBinding",
        "Secret",
        "Service",
        "ServiceAccount",
    ]
    deployment = one(docs, "Deployment")
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    container = pod["containers"][0]
    assert pod["serviceAccountName"] == one(docs, "ServiceAccount")["metadata"]["name"]
    assert container["image"] == "kubetrain/operator:0.1.0"
    assert container["args"] == ["operator"]
    # Only what the chart itself must decide: everything else is the operator's own default.
    assert container_env(deployment) == {
        "KUBETRAIN_WATCH_NAMESPACES": "",
        "KUBETRAIN_METRICS_PORT": "8000",
        "KUBETRAIN_HEALTH_PORT": "8080",
        # The runtime's init container runs the operator's own image (the chart knows it; the operator does not).
        "KUBETRAIN_RUNTIME_IMAGE": "kubetrain/operator:0.1.0",
        "KUBETRAIN_LEADER_ELECT": "true",
        "KUBETRAIN_LEASE_NAME": "kt-kubetrain",
        "KUBETRAIN_LEASE_NAMESPACE": None,
        "KUBETRAIN_AGENT_KEY": None,
    }
    lease_namespace = next(e for e in container["env"] if e["name"] == "KUBETRAIN_LEASE_NAMESPACE")
    assert lease_namespace["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    # The operator's key for in-place restarts' orders (operator/agent_io.py): from the chart's Secret.
    agent_key = next(e for e in container["env"] if e["name"] == "KUBETRAIN_AGENT_KEY")
    assert agent_key["valueFrom"] == {"secretKeyRef": {"name": "kt-kubetrain-agent-key", "key": "key"}}
    secret = one(docs, "Secret")
    assert secret["metadata"]["name"] == "kt-kubetrain-agent-key" and len(secret["data"]["key"]) >= 64
    assert secret["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"health": 8080, "metrics": 8000}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert "startupProbe" not in container  # /healthz answers from the first second
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    service = one(docs, "Service")
    assert service["spec"]["selector"] == spec["selector"]["matchLabels"]
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    assert all(doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "kubetrain" for doc in docs)


@pytest.mark.parametrize(
    ("values", "image"),
    [
        ({"image.repository": "registry.example/kt/operator", "image.tag": "1.2"}, "registry.example/kt/operator:1.2"),
        ({"operator.runtimeImage": "registry.example/kt/runtime:9"}, "registry.example/kt/runtime:9"),
        ({"operator.injectRuntime": "false"}, ""),
    ],
)
def test_the_runtime_image_follows_the_operator_image(home: Path, values: dict[str, str], image: str) -> None:
    env = container_env(one(render(home, values), "Deployment"))
    assert env["KUBETRAIN_RUNTIME_IMAGE"] == image


def test_two_replicas_hand_over_without_a_gap(home: Path) -> None:
    """A leader and a hot standby by default: a rolling update starts a new pod and waits for it
    to be Ready (listed) before stopping an old one; the replicas prefer different nodes; a drain
    evicts one at a time."""
    docs = render(home)
    deployment = one(docs, "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    selector = spec["selector"]["matchLabels"]
    assert spec["template"]["spec"]["affinity"] == {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "podAffinityTerm": {
                        "topologyKey": "kubernetes.io/hostname",
                        "labelSelector": {"matchLabels": selector},
                    },
                }
            ]
        }
    }
    budget = one(docs, "PodDisruptionBudget")
    assert budget["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": selector}}
    assert budget["metadata"]["namespace"] == RELEASE_NAMESPACE


def test_one_replica_without_election_is_recreated_and_has_no_lease(home: Path) -> None:
    docs = render(home, NON_DEFAULT["one-unelected"])
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}, "two unelected operators must never overlap"
    env = container_env(deployment)
    assert env["KUBETRAIN_LEADER_ELECT"] == "false" and "KUBETRAIN_LEASE_NAME" not in env
    assert not by_kind(docs, "Role") and not by_kind(docs, "PodDisruptionBudget")


def test_the_lease_role_is_the_one_lease_in_the_release_namespace(home: Path) -> None:
    for values in ({}, NON_DEFAULT["namespaced"]):
        docs = render(home, values)
        role = next(r for r in by_kind(docs, "Role") if r["metadata"]["name"].endswith("-leader-election"))
        assert role["metadata"]["namespace"] == RELEASE_NAMESPACE
        assert role["rules"] == [
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
            {
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "resourceNames": [container_env(one(docs, "Deployment"))["KUBETRAIN_LEASE_NAME"]],
                "verbs": ["get", "update", "watch"],
            },
        ]
        binding = next(b for b in by_kind(docs, "RoleBinding") if b["roleRef"]["name"] == role["metadata"]["name"])
        assert binding["metadata"]["namespace"] == RELEASE_NAMESPACE
        assert binding["subjects"][0]["name"] == one(docs, "ServiceAccount")["metadata"]["name"]


def test_restricted_pod_security(home: Path) -> None:
    """The restricted Pod Security Standard, field by field (the server's admission check is in
    test_chart_cluster.py)."""
    pod = one(render(home), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    for container in pod["containers"]:
        assert container["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        }
    assert not pod.get("hostNetwork") and not pod.get("hostPID")
    assert all("hostPath" not in volume for volume in pod.get("volumes", []))


def test_cluster_rbac_is_exactly_what_the_operator_uses(home: Path) -> None:
    docs = render(home)
    role = one(docs, "ClusterRole")
    assert rules_of(role) == NAMESPACED_RULES + CLUSTER_ONLY_RULES
    binding = one(docs, "ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    account = one(docs, "ServiceAccount")["metadata"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["name"], "namespace": RELEASE_NAMESPACE}]
    assert [r["metadata"]["name"] for r in by_kind(docs, "Role")] == ["kt-kubetrain-leader-election"]


def test_namespaced_mode_uses_roles_only(home: Path) -> None:
    docs = render(home, NON_DEFAULT["namespaced"])
    assert not by_kind(docs, "ClusterRole") and not by_kind(docs, "ClusterRoleBinding")
    election = "kt-kubetrain-leader-election"
    roles = {r["metadata"]["namespace"]: r for r in by_kind(docs, "Role") if r["metadata"]["name"] != election}
    bindings = {b["metadata"]["namespace"]: b for b in by_kind(docs, "RoleBinding") if b["roleRef"]["name"] != election}
    assert sorted(roles) == sorted(bindings) == ["team-a", "team-b"]
    for namespace, role in roles.items():
        assert rules_of(role) == NAMESPACED_RULES
        assert bindings[namespace]["roleRef"]["name"] == role["metadata"]["name"]
        assert bindings[namespace]["subjects"][0]["namespace"] == RELEASE_NAMESPACE
    assert container_env(one(docs, "Deployment"))["KUBETRAIN_WATCH_NAMESPACES"] == "team-a,team-b"


@pytest.mark.parametrize("values", [{}, NON_DEFAULT["namespaced"]], ids=["cluster", "namespaced"])
def test_no_wildcards_anywhere(home: Path, values: dict[str, str]) -> None:
    for doc in render(home, values):
        for rule in doc.get("rules", []):
            for key in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert "*" not in rule.get(key, []), f"{doc['kind']} has a wildcard in {key}: {rule}"
            assert "nonResourceURLs" not in rule
            # Only the Lease is granted by name (the operator's own objects are not known in advance).
            assert "resourceNames" not in rule or rule["resources"] == ["leases"], rule


def test_non_default_values_take_effect(home: Path) -> None:
    deployment = one(render(home, NON_DEFAULT["pinned-image"]), "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "kubetrain/operator@sha256:" + "ab" * 32
    assert container["imagePullPolicy"] == "Always"

    docs = render(home, NON_DEFAULT["tuned"])
    deployment = one(docs, "Deployment")
    assert deployment["metadata"]["name"] == "kubetrain"
    assert deployment["spec"]["replicas"] == 0
    pod = deployment["spec"]["template"]["spec"]
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
    assert list(pod["affinity"]) == ["nodeAffinity"], "a user's affinity replaces the default anti-affinity"
    assert not by_kind(docs, "PodDisruptionBudget")
    env = container_env(deployment)
    assert env["KUBETRAIN_TRAINER_IMAGE"] == "registry.example/kubetrain/trainer:0.1.0-cpu"
    assert env["KUBETRAIN_CLUSTER_DOMAIN"] == "corp.internal"
    assert env["KUBETRAIN_LOG_LEVEL"] == "debug"
    assert env["KUBETRAIN_LOG_FORMAT"] == "plain"
    assert env["KUBETRAIN_STUCK_TIMEOUT_SECONDS"] == "600"
    assert env["KUBETRAIN_PROGRESS_INTERVAL_SECONDS"] == "5"
    assert env["KUBETRAIN_LEASE_NAME"] == "kubetrain"
    assert env["KUBETRAIN_LEASE_DURATION_SECONDS"] == "30"
    assert env["KUBETRAIN_LEASE_RENEW_DEADLINE_SECONDS"] == "20"
    assert env["KUBETRAIN_LEASE_RETRY_PERIOD_SECONDS"] == "4"

    docs = render(home, NON_DEFAULT["external-rbac"])
    assert sorted(doc["kind"] for doc in docs) == ["Deployment", "PodDisruptionBudget", "Secret", "Service"]
    assert one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "ops"


def test_every_variable_the_chart_sets_is_a_flag_of_the_operator(home: Path) -> None:
    """The chart passes the operator's tunables by name only when set, so their defaults live
    in operator/settings.py alone; the names must still match `kubetrain operator`'s."""
    from typer.main import get_command

    from kubetrain.cli.main import app

    operator = get_command(app).commands["operator"]  # type: ignore[attr-defined]
    envvars = {param.envvar for param in operator.params if param.envvar}
    env = container_env(one(render(home, NON_DEFAULT["tuned"]), "Deployment"))
    # But the operator's agent key: a secret, read from the environment only (a flag shows in `ps`).
    secrets = {"KUBETRAIN_AGENT_KEY"}
    assert len(env) == 17 and set(env) - secrets <= envvars, set(env) - secrets - envvars


def test_metrics_toggles(home: Path) -> None:
    docs = render(home, NON_DEFAULT["servicemonitor"])
    monitor = one(docs, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["selector"]["matchLabels"] == one(docs, "Service")["spec"]["selector"]
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "30s", "scrapeTimeout": "10s"}
    ]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [RELEASE_NAMESPACE]}

    docs = render(home, NON_DEFAULT["no-metrics"])
    assert not by_kind(docs, "Service") and not by_kind(docs, "ServiceMonitor")
    deployment = one(docs, "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert [p["name"] for p in container["ports"]] == ["health"]
    assert container_env(deployment)["KUBETRAIN_METRICS_PORT"] == "0"


# Each a mistake a user could make, with the part of helm's error that must name it.
BAD_VALUES = [
    ({"replicaCount": "11"}, "/replicaCount"),
    ({"replicaCount": "2", "leaderElection.enabled": "false"}, "replicaCount > 1 needs leaderElection.enabled"),
    ({"leaderElection.leaseDurationSeconds": "1"}, "/leaderElection/leaseDurationSeconds"),
    ({"leaderElection.enabled": "yes"}, "/leaderElection/enabled"),
    ({"image.pullPolicy": "Sometimes"}, "/image/pullPolicy"),
    ({"image.digest": "sha1:abc"}, "/image/digest"),
    ({"image.tag": "has space"}, "/image/tag"),
    ({"metrics.port": "80"}, "/metrics/port"),
    ({"metrics.port": "70000"}, "/metrics/port"),
    ({"metrics.serviceMonitor.interval": "30"}, "/metrics/serviceMonitor/interval"),
    ({"metrics.serviceMonitor.interval": "soon"}, "/metrics/serviceMonitor/interval"),
    ({"operator.logLevel": "verbose"}, "/operator/logLevel"),
    ({"operator.watchNamespaces": "{Team_A}"}, "/operator/watchNamespaces/0"),
    ({"operator.watchNamespaces": "{a,a}"}, "/operator/watchNamespaces"),
    ({"operator.watchNamespaces": "team-a"}, "/operator/watchNamespaces"),
    ({"operator.trainerImage": ""}, "/operator/trainerImage"),
    ({"operator.clusterDomain": "Not A Domain"}, "/operator/clusterDomain"),
    ({"rbac.create": "maybe"}, "/rbac/create"),
    ({"operator.logFormat": "xml"}, "/operator/logFormat"),
    ({"operator.stuckTimeoutSeconds": "0"}, "/operator/stuckTimeoutSeconds"),
    ({"operator.progressIntervalSeconds": "-1"}, "/operator/progressIntervalSeconds"),
    ({"serviceAccount.annotations.a": "1"}, "/serviceAccount/annotations/a"),
    ({"operator.watchNamespace": "{a}"}, "watchNamespace"),
    ({"tolerance": "{}"}, "tolerance"),
    ({"metrics.port": "8080"}, "metrics.port and health.port must differ"),
]


@pytest.mark.parametrize(("values", "message"), BAD_VALUES, ids=[m for _, m in BAD_VALUES])
def test_bad_values_are_rejected(home: Path, values: dict[str, str], message: str) -> None:
    result = helm("template", "kt", str(CHART), *set_args(values), home=home, check=False)
    assert result.returncode != 0, f"{values} was accepted"
    assert message in result.stderr, result.stderr


def test_crd_is_not_templated(home: Path) -> None:
    """The upgrade story: the CRD lives in crds/ only, so `helm uninstall` never deletes it (and
    with it every TrainingJob). `--include-crds` shows it, `--skip-crds` leaves it out."""
    assert not by_kind(render(home), "CustomResourceDefinition")
    assert len(by_kind(render(home, None, "--include-crds"), "CustomResourceDefinition")) == 1
