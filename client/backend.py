"""What a Job needs from where it runs: the kubernetes backend (kubetrain.client.kube) and the
local one (kubetrain.client.localrun) both provide it, so `Job` is written once."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, Protocol

from kubetrain.api.models import TrainingJob, TrainingJobStatus
from kubetrain.client.logs import LogSource

BackendKind = Literal["kubernetes", "local"]


class Backend(Protocol):
    @property
    def kind(self) -> BackendKind: ...

    @property
    def namespace(self) -> str:
        """The namespace (locally: the directory that holds the run directories)."""
        ...

    @property
    def poll_s(self) -> float:
        """How often `Job.wait` reads the status."""
        ...

    def create(self, job: TrainingJob, config_maps: Mapping[str, Mapping[str, str]]) -> TrainingJob:
        """Create the job, and the ConfigMaps its template mounts (name -> data), owned by it."""
        ...

    def get(self, name: str) -> TrainingJob:
        """The job with its status; JobNotFound when there is none."""
        ...

    def status(self, name: str) -> TrainingJobStatus:
        """Only its status (what each `Job.wait` poll reads: the spec is not validated again)."""
        ...

    def list(self) -> list[TrainingJob]: ...

    def delete(self, name: str) -> None: ...

    def log_source(self, name: str) -> LogSource:
        """Where `kubetrain logs`' code reads this job's pods and logs."""
        ...

    def settle(self, name: str) -> None:
        """Return once a finished job's runner is done (locally: every process stopped)."""
        ...

    def ensure_live(self, name: str) -> None:
        """Raise JobStopped when nothing will move this unfinished job's status any more."""
        ...
