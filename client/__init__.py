"""kubetrain's Python client, for notebooks and pipelines:

    from kubetrain.client import Client

    client = Client("local")                  # or Client(namespace="team-a") for a cluster
    job = client.train(fn, nodes=2, args=(0.01,))
    job.wait()                                # a progress bar; JobFailed if it fails
    job.logs(), job.metrics()

Importing it costs neither kopf, torch, the Kubernetes client nor the local runner: each
backend is imported by the Client that uses it.
"""

from kubetrain.client.client import Client
from kubetrain.client.errors import (
    AlreadyExists,
    ApiError,
    ClientError,
    InvalidJob,
    JobFailed,
    JobNotFound,
    JobStopped,
    LogsUnavailable,
    ShipError,
    WaitTimeout,
)
from kubetrain.client.job import Job

__all__ = [
    "AlreadyExists",
    "ApiError",
    "Client",
    "ClientError",
    "InvalidJob",
    "Job",
    "JobFailed",
    "JobNotFound",
    "JobStopped",
    "LogsUnavailable",
    "ShipError",
    "WaitTimeout",
]
