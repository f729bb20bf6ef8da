"""The kubernetes backend: TrainingJobs (and a train() job's ConfigMap) through the API server,
with your kubeconfig (the rules of `kubetrain logs`: kubeconfig=, else KUBECONFIG or
~/.kube/config; in a pod its ServiceAccount). Every refusal becomes a ClientError carrying the
API server's own message."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from kubetrain.api import naming
from kubetrain.api.models import TrainingJob, TrainingJobStatus
from kubetrain.client.errors import AlreadyExists, ApiError, ClientError, InvalidJob, JobNotFound
from kubetrain.client.logs import Cluster, api_client

IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def default_namespace(kubeconfig: Path | None) -> str:
    """As kubectl chooses it: the current context's namespace, in a pod its own, else `default`."""
    from kubernetes import config

    try:
        _, current = config.list_kube_config_contexts(config_file=str(kubeconfig) if kubeconfig else None)  # type: ignore[no-untyped-call]
    except (config.ConfigException, OSError):
        if IN_CLUSTER_NAMESPACE.is_file():
            return IN_CLUSTER_NAMESPACE.read_text().strip()
        return "default"
    return str((current or {}).get("context", {}).get("namespace") or "default")


def server_message(error: Any) -> str:
    """The API server's own words from an ApiException (its Status message), else its reason."""
    try:
        body = json.loads(error.body)
    except (TypeError, ValueError):
        body = None
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return f"{error.status} {error.reason}"


class KubernetesBackend:
    kind: Literal["kubernetes"] = "kubernetes"
    poll_s = 1.0

    def __init__(self, namespace: str | None, kubeconfig: str | Path | None) -> None:
        from kubernetes import client, config

        path = Path(kubeconfig) if kubeconfig is not None else None
        try:
            self.api = api_client(path)
        except (config.ConfigException, OSError) as error:
            raise ClientError(f"no cluster to talk to: {error} (give kubeconfig=, or set KUBECONFIG)") from None
        self._namespace = namespace or default_namespace(path)
        self.custom = client.CustomObjectsApi(self.api)
        self.core = client.CoreV1Api(self.api)

    @property
    def namespace(self) -> str:
        return self._namespace

    def _call(
        self,
        what: str,
        request: Callable[..., Any],
        *args: Any,
        missing: type[ClientError] = JobNotFound,
        **kwargs: Any,
    ) -> Any:
        """`request(*args, **kwargs)`, its refusal turned into the ClientError that says it (a 404:
        `missing`)."""
        from kubernetes import client
        from urllib3.exceptions import HTTPError

        try:
            return request(*args, **kwargs)
        except client.ApiException as error:
            message = f"{what}: {server_message(error)}"
            if error.status == 404:
                raise missing(message) from None
            if error.status == 409:
                raise AlreadyExists(message) from None
            if error.status == 422:
                raise InvalidJob(message) from None
            raise ApiError(message, error.status) from None
        except HTTPError as error:
            raise ApiError(f"{what}: cannot reach the API server at {self.api.configuration.host}: {error}") from None

    def _job(self, document: Mapping[str, Any]) -> TrainingJob:
        try:
            return TrainingJob.model_validate(document)
        except ValidationError as error:
            name = document.get("metadata", {}).get("name")
            raise ApiError(
                f"trainingjob {name}: the server's object does not fit this client's models: {error}"
            ) from None

    # --- create ---------------------------------------------------------------------------------

    def create(self, job: TrainingJob, config_maps: Mapping[str, Mapping[str, str]]) -> TrainingJob:
        if job.metadata.namespace not in (None, self.namespace):
            raise InvalidJob(
                f"metadata.namespace: {job.metadata.namespace!r} differs from the client's namespace {self.namespace!r}"
            )
        body = job.wire()
        body["metadata"]["namespace"] = self.namespace
        created = self._call(
            f"creating trainingjob {job.metadata.name or job.metadata.generate_name} in namespace {self.namespace}",
            self.custom.create_namespaced_custom_object,
            naming.GROUP,
            naming.VERSION,
            self.namespace,
            naming.PLURAL,
            body,
            missing=ApiError,  # no such namespace, or no TrainingJob API (the CRD is not installed)
        )
        name, uid = created["metadata"]["name"], created["metadata"]["uid"]
        try:
            for map_name, data in config_maps.items():
                self._call(
                    f"creating configmap {map_name} of trainingjob {name}",
                    self.core.create_namespaced_config_map,
                    self.namespace,
                    _config_map(map_name, name, uid, data),
                    missing=ApiError,
                )
        except ClientError:
            # Without its ConfigMap the job's pods would wait forever: take the job back.
            self._call(f"deleting trainingjob {name}", self._delete, name)
            raise
        return self._job(created)

    # --- read -----------------------------------------------------------------------------------

    def _get(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self._call(
            f"trainingjob {name} in namespace {self.namespace}",
            self.custom.get_namespaced_custom_object,
            naming.GROUP,
            naming.VERSION,
            self.namespace,
            naming.PLURAL,
            name,
        )
        return found

    def get(self, name: str) -> TrainingJob:
        return self._job(self._get(name))

    def status(self, name: str) -> TrainingJobStatus:
        document = self._get(name)
        try:
            return TrainingJobStatus.model_validate(document.get("status") or {})
        except ValidationError as error:
            raise ApiError(
                f"trainingjob {name}: the server's status does not fit this client's models: {error}"
            ) from None

    def list(self) -> list[TrainingJob]:
        listed = self._call(
            f"listing trainingjobs in namespace {self.namespace}",
            self.custom.list_namespaced_custom_object,
            naming.GROUP,
            naming.VERSION,
            self.namespace,
            naming.PLURAL,
        )
        return sorted((self._job(item) for item in listed["items"]), key=lambda job: job.name)

    def log_source(self, name: str) -> Cluster:
        return Cluster(self.api, self.namespace)

    # --- lifecycle ------------------------------------------------------------------------------

    def _delete(self, name: str) -> None:
        # Background: the call returns at once; the garbage collector removes the pods, the
        # Service and the ConfigMap (all owned by the job).
        self.custom.delete_namespaced_custom_object(
            naming.GROUP, naming.VERSION, self.namespace, naming.PLURAL, name, propagation_policy="Background"
        )

    def delete(self, name: str) -> None:
        self._call(f"deleting trainingjob {name} in namespace {self.namespace}", self._delete, name)

    def settle(self, name: str) -> None:
        """Nothing to wait for: a finished job's pods end on their own."""

    def ensure_live(self, name: str) -> None:
        """The operator moves the status; whether it runs is not the client's to know."""


def _config_map(name: str, job: str, uid: str, data: Mapping[str, str]) -> dict[str, Any]:
    """A ConfigMap owned by the job: the garbage collector deletes it with the job. Not a
    controller reference (the operator controls the job's children) and without
    blockOwnerDeletion, which would need update rights on trainingjobs/finalizers."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "labels": {naming.LABEL_JOB: job},
            "ownerReferences": [{"apiVersion": naming.API_VERSION, "kind": naming.KIND, "name": job, "uid": uid}],
        },
        "data": dict(data),
    }
