"""The chart against a real kube-apiserver: the rendered manifests pass server-side dry-run
(schemas, admission, Pod Security), `helm install` really installs, and the operator's
ServiceAccount can do exactly what the operator needs: `kubectl auth can-i` for every allowed
and a table of denied requests, then the real `kubetrain operator`, configured by the chart's
own env and authenticated as that ServiceAccount, reconciles a job through a gang restart."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.controlplane import ControlPlane, free_ports, service_account_kubeconfig
from support.jobs import valid_job
from support.kubelet import FakeKubelet
from support.operator_process import OperatorProcess
from support.tools import CHART, CLUSTER_ONLY_RULES, LEASE_RULES, NAMESPACED_RULES
from support.waiting import wait_for

from kubetrain.api import naming

pytestmark = pytest.mark.cluster

CRD_NAME = naming.CRD_NAME

# Requests the operator never makes; each must be refused in every mode.
DENIED: list[tuple[str, str]] = [
    ("create", "trainingjobs.kubetrain.dev"),
    ("update", "trainingjobs.kubetrain.dev"),
    ("patch", "trainingjobs.kubetrain.dev"),
    ("patch", "trainingjobs.kubetrain.dev/status"),
    ("update", "pods"),
    ("create", "pods/exec"),
    ("create", "pods/eviction"),
    ("delete", "services"),
    ("update", "services"),
    ("get", "secrets"),
    ("list", "secrets"),
    ("list", "configmaps"),
    ("update", "configmaps"),
    ("delete", "configmaps"),
    ("create", "persistentvolumeclaims"),
    ("create", "serviceaccounts/token"),
    ("create", "deployments.apps"),
    ("delete", "workloads.kueue.x-k8s.io"),
    ("patch", "workloads.kueue.x-k8s.io/status"),
    ("update", "resourceflavors.kueue.x-k8s.io"),
    ("create", "jobs.batch"),
    ("create", "roles.rbac.authorization.k8s.io"),
    ("create", "rolebindings.rbac.authorization.k8s.io"),
    ("delete", "events"),
    ("list", "nodes"),
    ("create", "customresourcedefinitions.apiextensions.k8s.io"),
    ("delete", "customresourcedefinitions.apiextensions.k8s.io"),
    ("*", "*"),
]


def can_i(
    cp: ControlPlane, subject: str, verb: str, resource: str, namespace: str | None, object_name: str = ""
) -> bool:
    """What `kubectl auth can-i --as=<subject>` asks, as a SubjectAccessReview naming the group:
    kubectl resolves the type through discovery, and for an API this server does not serve
    (PodGroups without their feature gates) it asks about a core resource of that dotted name."""
    group_resource, _, subresource = resource.partition("/")
    name, _, group = group_resource.partition(".")
    account = subject.split(":")
    groups = ["system:authenticated"]
    if account[:2] == ["system", "serviceaccount"]:
        groups += ["system:serviceaccounts", f"system:serviceaccounts:{account[2]}"]
    attributes = {"verb": verb, "group": "*" if name == "*" else group, "resource": name, "subresource": subresource}
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": subject,
            "groups": groups,
            "resourceAttributes": {**attributes, "namespace": namespace or "", "name": object_name},
        },
    }
    answer = json.loads(kubectl(cp, "create", "-o", "json", "-f", "-", input=json.dumps(review)).stdout)
    return bool(answer["status"].get("allowed"))


def helm(cp: ControlPlane, *args: str) -> str:
    result = cp.helm(*args, check=False)
    assert result.returncode == 0, f"helm {' '.join(args)}:\n{result.stderr}"
    return result.stdout


def kubectl(cp: ControlPlane, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    result = cp.kubectl(*args, input=input, check=False)
    assert result.returncode == 0, f"kubectl {' '.join(args)}:\n{result.stderr}"
    return result


def granted(cp: ControlPlane, subject: str, namespace: str) -> dict[str, set[str]]:
    """Every resource rule that applies to `subject` in `namespace` (`kubectl auth can-i --list`),
    minus what any ServiceAccount gets (the same listing for the namespace's `default` account)."""

    def listing(who: str) -> dict[str, set[str]]:
        out = kubectl(cp, "auth", "can-i", "--list", f"--as={who}", "-n", namespace).stdout
        rules: dict[str, set[str]] = {}
        for line in out.splitlines()[1:]:
            match = re.fullmatch(r"(\S+)\s+\[\]\s+\[[^\]]*\]\s+\[([^\]]*)\]", line.strip())
            if match:
                rules.setdefault(match.group(1), set()).update(match.group(2).split())
        return rules

    baseline = listing(f"system:serviceaccount:{namespace}:default")
    extra = {res: verbs - baseline.get(res, set()) for res, verbs in listing(subject).items()}
    return {res: verbs for res, verbs in extra.items() if verbs}


def as_grants(rules: list[tuple[str, str, tuple[str, ...]]]) -> dict[str, set[str]]:
    return {resource_name(group, resource): set(verbs) for group, resource, verbs in rules}


def resource_name(group: str, resource: str) -> str:
    name, _, sub = resource.partition("/")
    full = f"{name}.{group}" if group else name
    return f"{full}/{sub}" if sub else full


def expected_requests(rules: list[tuple[str, str, tuple[str, ...]]]) -> list[tuple[str, str]]:
    return [(verb, resource_name(group, resource)) for group, resource, verbs in rules for verb in verbs]


@pytest.fixture
def extra_namespaces(control_plane: ControlPlane) -> Iterator[list[str]]:
    """Two more fresh namespaces: one watched, one not."""
    names = [f"watched-{uuid.uuid4().hex[:6]}", f"other-{uuid.uuid4().hex[:6]}"]
    for name in names:
        control_plane.kubectl("create", "namespace", name)
    yield names
    for name in names:
        control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def release(control_plane: ControlPlane, namespace: str) -> Iterator[tuple[str, str]]:
    """A release name unique to the test (its ClusterRole is cluster-scoped), uninstalled after."""
    name = f"kt-{uuid.uuid4().hex[:6]}"
    yield name, namespace
    control_plane.helm("uninstall", name, "-n", namespace, "--wait=false", check=False)


def template(cp: ControlPlane, release: str, namespace: str, *args: str) -> str:
    return helm(cp, "template", release, str(CHART), "-n", namespace, *args)


@pytest.mark.parametrize("mode", ["cluster", "namespaced"])
def test_server_dry_run_accepts_the_rendered_chart(
    control_plane: ControlPlane, namespace: str, extra_namespaces: list[str], mode: str
) -> None:
    """The API server validates every object (schemas, RBAC escalation checks, admission) and
    Pod Security's `restricted` level has nothing to warn about."""
    control_plane.kubectl(
        "label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/warn=restricted",
    )  # fmt: skip
    args = ["--include-crds", "--set-string", "metrics.service.annotations.prometheus\\.io/scrape=true"]
    if mode == "namespaced":
        args += ["--set", f"operator.watchNamespaces={{{extra_namespaces[0]}}}"]
    manifests = template(control_plane, "dry", namespace, *args)
    result = kubectl(control_plane, "apply", "--dry-run=server", "-f", "-", input=manifests)
    kinds = {line.split("/")[0] for line in result.stdout.splitlines()}
    expected = {"serviceaccount", "service", "deployment.apps", "customresourcedefinition.apiextensions.k8s.io"}
    expected.add("secret")  # the operator's agent key (agentkey.yaml)
    # The Lease's Role in the release namespace is there in both modes.
    expected |= {
        "role.rbac.authorization.k8s.io",
        "rolebinding.rbac.authorization.k8s.io",
        "poddisruptionbudget.policy",
    }
    if mode == "cluster":
        expected |= {"clusterrole.rbac.authorization.k8s.io", "clusterrolebinding.rbac.authorization.k8s.io"}
    assert kinds == expected, result.stdout
    assert "PodSecurity" not in result.stderr, result.stderr


def test_helm_install_cluster_mode_grants_exactly_the_operator_rules(
    control_plane: ControlPlane, release: tuple[str, str], extra_namespaces: list[str]
) -> None:
    name, namespace = release
    out = helm(control_plane, "install", name, str(CHART), "-n", namespace)
    # NOTES.txt: the next commands, with this release's names.
    assert f"kubectl -n {namespace} rollout status deployment/{name}-kubetrain" in out
    assert "kubectl wait --for=condition=Succeeded trainingjob/digits-cpu" in out
    control_plane.kubectl("get", "crd", CRD_NAME)
    deployment = yaml.safe_load(
        control_plane.kubectl("get", "deployment", f"{name}-kubetrain", "-n", namespace, "-o", "yaml").stdout
    )
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == f"{name}-kubetrain"

    subject = f"system:serviceaccount:{namespace}:{name}-kubetrain"
    # Exactly the operator's rules, in any namespace, nothing more; its Lease in its own only.
    for anywhere in extra_namespaces:
        assert granted(control_plane, subject, anywhere) == as_grants(NAMESPACED_RULES + CLUSTER_ONLY_RULES)
    assert granted(control_plane, subject, namespace) == as_grants(NAMESPACED_RULES + CLUSTER_ONLY_RULES + LEASE_RULES)
    assert_lease_grants(control_plane, subject, namespace, f"{name}-kubetrain", extra_namespaces[0])
    # The same, request by request, as `kubectl auth can-i` answers them.
    for verb, resource in expected_requests(NAMESPACED_RULES):
        assert can_i(control_plane, subject, verb, resource, None), f"cannot {verb} {resource} cluster-wide"
    for verb, resource in expected_requests(CLUSTER_ONLY_RULES):
        assert can_i(control_plane, subject, verb, resource, None), f"cannot {verb} {resource}"
    for verb, resource in [*DENIED, ("list", "namespaces")]:
        assert not can_i(control_plane, subject, verb, resource, extra_namespaces[0]), f"may {verb} {resource}"

    # The upgrade story: Helm never upgrades crds/, so an upgrade applies the chart's CRD first
    # (the command NOTES.txt and docs/install.md give), taking over the fields Helm created.
    crds = helm(control_plane, "show", "crds", str(CHART))
    kubectl(control_plane, "apply", "--server-side", "--force-conflicts", "-f", "-", input=crds)
    assert "helm show crds" in out
    # And uninstalling the chart leaves the CRD (and every TrainingJob) in place.
    helm(control_plane, "uninstall", name, "-n", namespace, "--wait")
    control_plane.kubectl("get", "crd", CRD_NAME)
    assert not can_i(control_plane, subject, "create", "pods", extra_namespaces[0])


def test_helm_install_namespaced_mode_is_confined_to_its_namespaces(
    control_plane: ControlPlane, release: tuple[str, str], extra_namespaces: list[str]
) -> None:
    name, namespace = release
    watched, other = extra_namespaces
    # A second release next to a cluster-mode one would find the CRD present: helm skips it.
    helm(
        control_plane, "install", name, str(CHART), "-n", namespace, "--set", f"operator.watchNamespaces={{{watched}}}"
    )
    subject = f"system:serviceaccount:{namespace}:{name}-kubetrain"
    assert granted(control_plane, subject, watched) == as_grants(NAMESPACED_RULES)
    assert granted(control_plane, subject, other) == {}
    assert granted(control_plane, subject, namespace) == as_grants(LEASE_RULES)
    assert_lease_grants(control_plane, subject, namespace, f"{name}-kubetrain", watched)
    for verb, resource in expected_requests(NAMESPACED_RULES):
        assert can_i(control_plane, subject, verb, resource, watched), f"cannot {verb} {resource} in {watched}"
        assert not can_i(control_plane, subject, verb, resource, None), f"may {verb} {resource} cluster-wide"
    for verb, resource in [*DENIED, *expected_requests(CLUSTER_ONLY_RULES)]:
        assert not can_i(control_plane, subject, verb, resource, watched), f"may {verb} {resource} in {watched}"


def assert_lease_grants(cp: ControlPlane, subject: str, namespace: str, lease: str, elsewhere: str) -> None:
    """The release's Lease may be read, renewed and watched, any Lease created (RBAC cannot
    name what a create makes); another Lease, or one elsewhere, not at all."""
    resource = "leases.coordination.k8s.io"
    for verb in ("get", "update", "watch"):
        assert can_i(cp, subject, verb, resource, namespace, lease), f"cannot {verb} Lease {lease}"
        assert not can_i(cp, subject, verb, resource, namespace, "kube-scheduler"), f"may {verb} another Lease"
        assert not can_i(cp, subject, verb, resource, elsewhere, lease), f"may {verb} Leases in {elsewhere}"
    assert can_i(cp, subject, "create", resource, namespace)
    assert not can_i(cp, subject, "create", resource, elsewhere)
    for verb in ("list", "delete", "patch"):
        assert not can_i(cp, subject, verb, resource, namespace, lease), f"may {verb} Lease {lease}"


def env_value(cp: ControlPlane, namespace: str, item: dict[str, Any]) -> str:
    """A container's env entry in `namespace` as the kubelet fills it in: a value, the Downward
    API's namespace, or a key of a Secret (the chart's agent key)."""
    if "value" in item:
        return str(item["value"])
    source = item["valueFrom"]
    if "fieldRef" in source:
        return {"metadata.namespace": namespace}[source["fieldRef"]["fieldPath"]]
    ref = source["secretKeyRef"]
    data = cp.kubectl("get", "secret", ref["name"], "-n", namespace, "-o", f"jsonpath={{.data.{ref['key']}}}").stdout
    return base64.b64decode(data).decode()


def test_operator_runs_with_the_charts_env_and_service_account(
    control_plane: ControlPlane, crds_installed: ControlPlane, release: tuple[str, str], extra_namespaces: list[str],
    tmp_path: Path,
) -> None:  # fmt: skip
    """`kubetrain operator` with the Deployment's own env, as the chart's ServiceAccount in
    namespaced mode (the narrower rule set; cluster mode adds only the CRD watch): it creates
    the gang, writes status, posts events, restarts the gang after a pod is deleted, reads
    rank 0's log and deletes the finished job when its TTL runs out: every rule is used once.
    A missing verb would show up as a 403 in its log."""
    from kubernetes import client

    name, namespace = release
    watched = extra_namespaces[0]
    values = [f"operator.watchNamespaces={{{watched}}}", "operator.logFormat=plain", "operator.logLevel=debug"]
    values = [arg for value in [*values, "operator.progressIntervalSeconds=1"] for arg in ("--set", value)]
    helm(control_plane, "install", name, str(CHART), "-n", namespace, *values)
    rendered = yaml.safe_load_all(template(control_plane, name, namespace, *values))
    deployment = next(doc for doc in rendered if doc and doc["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {item["name"]: env_value(control_plane, namespace, item) for item in container["env"]}
    health, metrics = free_ports(2)
    env |= {"KUBETRAIN_HEALTH_PORT": str(health), "KUBETRAIN_METRICS_PORT": str(metrics)}
    kubeconfig = service_account_kubeconfig(control_plane, namespace, f"{name}-kubetrain", tmp_path / "sa.kubeconfig")
    operator = OperatorProcess(kubeconfig, tmp_path / "operator.log")
    try:
        operator.start_deployed(container["args"], env)
        assert operator.healthy() and operator.metrics()
        # It leads on the chart's Lease, through the chart's Role.
        holder = "jsonpath={.spec.holderIdentity}"
        lease = ("get", "lease", f"{name}-kubetrain", "-n", namespace, "-o", holder)
        wait_for(
            lambda: control_plane.kubectl(*lease, check=False).stdout.strip(), 60, "the operator to take the Lease"
        )

        with control_plane.api_client() as api:
            custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
            job = valid_job("rbac-probe", runPolicy={"maxRestarts": 2, "ttlSecondsAfterFinished": 0})
            custom.create_namespaced_custom_object(naming.GROUP, naming.VERSION, watched, naming.PLURAL, job)

            def pods() -> list[Any]:
                return list(core.list_namespaced_pod(watched, label_selector=f"{naming.LABEL_JOB}=rbac-probe").items)

            def status() -> dict[str, Any]:
                body = custom.get_namespaced_custom_object(
                    naming.GROUP, naming.VERSION, watched, naming.PLURAL, "rbac-probe"
                )
                return dict(body.get("status") or {})

            # Generous: were kopf's cluster-wide scans enabled in namespaced mode, it would retry
            # their refusals for ~55 s before reconciling (the operator disables them).
            first = wait_for(lambda: (found := pods()) and len(found) == 2 and found, 120, "the gang's 2 pods")
            core.read_namespaced_service("rbac-probe", watched)
            wait_for(lambda: status().get("phase"), 60, "status written through the status subresource")
            wait_for(
                lambda: core.list_namespaced_event(watched, field_selector="involvedObject.name=rbac-probe").items,
                60,
                "an event on the TrainingJob",
            )
            core.delete_namespaced_pod(first[1].metadata.name, watched)
            # A deleted pod is a disruption: the restart is not counted against maxRestarts.
            wait_for(lambda: status().get("attempt", 0) >= 1, 60, "a gang restart after a pod was deleted")
            old_uids = {pod.metadata.uid for pod in first}

            def new_gang() -> list[Any] | None:
                found = pods()
                fresh = len(found) == 2 and not {p.metadata.uid for p in found} & old_uids
                return found if fresh else None

            gang = wait_for(
                new_gang,
                60,
                "the operator to delete the surviving pod and create a new gang",
            )
            # Running pods: the operator reads rank 0's log for progress (pods/log). There is no
            # kubelet to serve it, so the read fails, but only after authorization.
            kubelet = FakeKubelet(api)
            kubelet.ensure_node()
            for pod in gang:
                kubelet.run(watched, pod.metadata.name)
            wait_for(
                lambda: f"reading the log of {watched}/rbac-probe-node-0 failed" in operator.log(),
                60,
                "the operator to read rank 0's log",
            )
            # Finished, with ttlSecondsAfterFinished: 0: the operator deletes the TrainingJob.
            for pod in gang:
                kubelet.succeed(watched, pod.metadata.name)

            def job_gone() -> bool:
                try:
                    status()
                except client.ApiException as exc:
                    return exc.status == 404
                return False

            wait_for(job_gone, 60, "the operator to delete the finished job (ttlSecondsAfterFinished: 0)")
    finally:
        operator.stop()
    # With exact namespaces the operator turns kopf's cluster-wide namespace and CRD scans off;
    # were they on, a Role could not grant them and kopf would fall back after logging the
    # refusals, so those alone are tolerated. Any other refusal is a rule the chart is missing.
    expected_refusals = (
        'cannot list resource "namespaces" in API group "" at the cluster scope',
        'cannot list resource "customresourcedefinitions" in API group "apiextensions.k8s.io" at the cluster scope',
        "Not enough permissions",
    )
    forbidden = [
        line
        for line in operator.log().splitlines()
        if re.search(r"\b403\b|forbidden", line, re.IGNORECASE) and not any(t in line for t in expected_refusals)
    ]
    assert not forbidden, "\n".join(forbidden)
