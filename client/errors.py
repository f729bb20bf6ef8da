"""What the client raises: one base class, each error carrying the API server's message or
the local runner's reason in words."""

from __future__ import annotations

from kubetrain.api.models import TrainingJobStatus


class ClientError(Exception):
    """Base of every error kubetrain.client raises."""


class InvalidJob(ClientError, ValueError):
    """A TrainingJob (or train()'s options) the models or the API server refuse; the message
    names each bad field. Nothing was created."""


class ShipError(ClientError, ValueError):
    """A function or argument train() cannot ship, and why. Nothing was created."""


class JobNotFound(ClientError, LookupError):
    """No TrainingJob of that name in the namespace (or the local run directory)."""


class AlreadyExists(ClientError):
    """A TrainingJob of that name exists already."""


class ApiError(ClientError):
    """The API server refused a request; `status` is its HTTP status, the message its own."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class JobFailed(ClientError):
    """`Job.wait()` saw the job fail; `status` holds the Failed condition and `status.failures`."""

    def __init__(self, name: str, status: TrainingJobStatus) -> None:
        self.name = name
        self.status = status
        super().__init__(failure_message(name, status))


class JobStopped(ClientError):
    """A local job that ended without succeeding or failing: deleted, or its runner stopped."""


class WaitTimeout(ClientError, TimeoutError):
    """`Job.wait(timeout=...)` ran out; the job goes on."""


class LogsUnavailable(ClientError):
    """No log to read: the job has no pods (yet, or any more), or that attempt's are gone."""


def failure_message(name: str, status: TrainingJobStatus) -> str:
    """`trainingjob NAME failed (Reason): message`, with the last recorded failure's details."""
    condition = next((c for c in status.conditions or [] if c.type == "Failed" and c.status == "True"), None)
    text = f"trainingjob {name} failed"
    if condition is not None:
        text += f" ({condition.reason})" + (f": {condition.message}" if condition.message else "")
    if status.failures:
        last = status.failures[-1]
        where = "" if last.rank is None else f" on node {last.rank}"
        code = "" if last.exit_code is None else f", exit code {last.exit_code}"
        text += f"\nlast failure: attempt {last.attempt}{where} ({last.reason}{code})"
        if last.message:
            text += ":\n" + last.message
    return text
