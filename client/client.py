"""`Client`: submit TrainingJobs or Python functions, on a cluster or on this machine."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from kubetrain.api.function import config_map_name
from kubetrain.api.models import TrainingJob
from kubetrain.client.backend import Backend
from kubetrain.client.errors import ClientError
from kubetrain.client.job import Job
from kubetrain.client.ship import ship
from kubetrain.client.spec import as_job, function_files, function_job, generated_name

DEFAULT_RUN_DIR = Path("runs")


class Client:
    """`Client()` or `Client("kubernetes", namespace=..., kubeconfig=...)`: TrainingJobs through the
    API server (the namespace defaults to the kubeconfig context's, as kubectl's does).
    `Client("local", run_dir="runs")`: the same jobs as `kubetrain run --local` runs them, each in
    `<run_dir>/<name>/`, supervised by a thread of this process.

    The Kubernetes client is imported only by the kubernetes backend and the local runner only by
    the local one (`pip install 'kubetrain[client]'`; the local backend's nodes also need torch:
    `kubetrain[client,trainer]`)."""

    def __init__(
        self,
        backend: Literal["kubernetes", "local"] = "kubernetes",
        *,
        namespace: str | None = None,
        kubeconfig: str | os.PathLike[str] | None = None,
        run_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self._backend: Backend
        if backend == "kubernetes":
            if run_dir is not None:
                raise ClientError(
                    "run_dir: only the local backend has one (namespace= and kubeconfig= choose a cluster)"
                )
            from kubetrain.client.kube import KubernetesBackend

            self._backend = KubernetesBackend(namespace, None if kubeconfig is None else Path(kubeconfig))
        elif backend == "local":
            if namespace is not None or kubeconfig is not None:
                raise ClientError("namespace, kubeconfig: the local backend has none (run_dir= says where jobs run)")
            from kubetrain.client.localrun import LocalBackend

            self._backend = LocalBackend(Path(run_dir) if run_dir is not None else DEFAULT_RUN_DIR)
        else:
            raise ClientError(f"backend: {backend!r} is not one of 'kubernetes', 'local'")

    @property
    def backend(self) -> Literal["kubernetes", "local"]:
        return self._backend.kind

    @property
    def namespace(self) -> str:
        """The namespace (locally: the directory holding the run directories)."""
        return self._backend.namespace

    def __repr__(self) -> str:
        return f"Client({self.backend!r}, namespace={self.namespace!r})"

    def submit(self, job: TrainingJob | Mapping[str, Any] | str | os.PathLike[str]) -> Job:
        """Create a TrainingJob from its model, a dict (camelCase, as in YAML) or a YAML file path
        (its TrainingJob document; a PVC beside it is left to kubectl). InvalidJob names every bad
        field before anything is created."""
        created = self._backend.create(as_job(job), {})
        return Job(self._backend, created.name)

    def train(
        self,
        fn: Callable[..., Any],
        *,
        nodes: int = 1,
        gpus_per_node: int = 0,
        image: str | None = None,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        name: str | None = None,
        spec: Mapping[str, Any] | None = None,
    ) -> Job:
        """Run `fn(*args, **kwargs)` on every rank of `nodes` x max(gpus_per_node, 1) processes under
        torchrun, the process group set up as `kubetrain.trainer.lib.distributed()` does (so
        `lib.context()` is the rank's DistContext). `fn` is shipped by source
        (kubetrain.client.ship says what can be; anything else is refused before anything is
        created); args and kwargs travel as JSON.
        `image` must hold kubetrain[worker] (default: the operator's trainer image). `name`
        defaults to the function's name plus a random suffix; `spec` adds TrainingJob spec
        fields (camelCase: {"runPolicy": {"maxRestarts": 0}, "resources": ...})."""
        shipment = ship(fn, args, kwargs)
        job_name = name or generated_name(fn.__name__)
        job = function_job(
            shipment,
            name=job_name,
            origin=f"{fn.__module__}.{fn.__qualname__}",
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            image=image,
            env=env,
            spec=spec,
        )
        created = self._backend.create(job, {config_map_name(job_name): function_files(shipment)})
        return Job(self._backend, created.name)

    def job(self, name: str) -> Job:
        """A handle on an existing job (JobNotFound when there is none)."""
        self._backend.get(name)
        return Job(self._backend, name)

    def list_jobs(self) -> list[Job]:
        """Every TrainingJob of the namespace (locally: of run_dir), by name."""
        return [Job(self._backend, job.name) for job in self._backend.list()]
