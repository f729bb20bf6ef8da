"""What a failed step of a cluster test prints: not just "timed out", but what a user would look
at next — the operator's log tail, the events of the job and its pods, rank 0's log tail, and
whatever the cluster provider knows (a real node's daemon logs).

    diagnose = Diagnostics(kubectl, "e2e", operator_log=lambda n: ..., extra=node.describe_failure)
    with diagnose.step("digits-cpu Succeeded", job="digits-cpu"):
        kubectl("wait", "--for=condition=Succeeded", "trainingjob/digits-cpu", ...)

A failure inside the block is raised again as StepFailed whose message holds all of it.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from kubetrain.api import naming

Kubectl = Callable[..., subprocess.CompletedProcess[str]]
TAIL = 40


class StepFailed(AssertionError):
    """A step of a cluster test failed; the message carries the diagnostics."""


def _nothing() -> str:
    return ""


@dataclass
class Diagnostics:
    kubectl: Kubectl  # kubectl(*args, check=False) -> CompletedProcess, against the test's cluster
    namespace: str  # the jobs' namespace
    operator_log: Callable[[int], str]  # the operator's last N log lines
    extra: Callable[[], str] = field(default=_nothing)  # the provider's own story (node daemons)

    @contextmanager
    def step(self, what: str, *, job: str) -> Iterator[None]:
        try:
            yield
        except Exception as error:
            raise StepFailed(f"step failed: {what}: {error}\n\n{self.report(job)}") from error

    def report(self, job: str) -> str:
        sections = [
            (f"operator log (last {TAIL} lines)", _safely(lambda: self.operator_log(TAIL))),
            (f"events of trainingjob {job} and its pods", _safely(lambda: self.events(job))),
            (f"rank 0's log ({naming.pod_name(job, 0)}, last {TAIL} lines)", _safely(lambda: self.rank0_log(job))),
            ("cluster provider", _safely(self.extra)),
        ]
        return "\n".join(f"===== {title}\n{text.rstrip() or '(empty)'}" for title, text in sections)

    def events(self, job: str) -> str:
        got = self.kubectl("get", "events", "-n", self.namespace, "-o", "json", check=False)
        if got.returncode != 0:
            return got.stderr
        pods = f"{job}{naming.NODE_INFIX}"
        lines = []
        for event in json.loads(got.stdout)["items"]:
            involved = event.get("involvedObject") or {}
            name = involved.get("name") or ""
            if name == job or name.startswith(pods):
                when = event.get("lastTimestamp") or event.get("eventTime") or ""
                lines.append(
                    f"{when} {event.get('type')} {event.get('reason')} "
                    f"{involved.get('kind')}/{name}: {event.get('message', '').strip()}"
                )
        return "\n".join(sorted(lines))

    def rank0_log(self, job: str) -> str:
        pod = naming.pod_name(job, 0)
        got = self.kubectl(
            "logs", "-n", self.namespace, pod, "-c", naming.CONTAINER_NAME, f"--tail={TAIL}", check=False
        )
        return got.stdout if got.returncode == 0 else got.stderr


def _safely(read: Callable[[], str]) -> str:
    """A diagnostic that fails says why instead of hiding the step's own failure."""
    try:
        return read()
    except Exception as error:
        return f"(could not read: {error!r})"


def deployment_log(kubectl: Kubectl, namespace: str, deployment: str) -> Callable[[int], str]:
    """The operator's log when it runs in the cluster (the chart's Deployment): every replica's,
    each line prefixed with its pod (`kubectl logs deployment/...` shows one pod's, which may be
    the standby's)."""

    def tail(lines: int) -> str:
        labels = kubectl("get", "deployment", deployment, "-n", namespace, "-o", "json", check=False)
        if labels.returncode != 0:
            return labels.stderr
        selector = json.loads(labels.stdout)["spec"]["selector"]["matchLabels"]
        pods = ",".join(f"{key}={value}" for key, value in selector.items())
        got = kubectl("logs", "-n", namespace, "-l", pods, "--prefix", f"--tail={lines}", check=False)
        return got.stdout if got.returncode == 0 else got.stderr

    return tail
