"""The `kubetrain` command line. Each command imports its machinery lazily: `kubetrain crd`
must not pay for kopf, and nothing here may import torch."""

from __future__ import annotations

import enum
import sys
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Annotated

import typer

# The operator's defaults, written once (a light module: no kopf, no API models).
from kubetrain.operator.settings import DEFAULTS

app = typer.Typer(
    name="kubetrain",
    help="Kubernetes-native distributed PyTorch training.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


class LogLevel(enum.StrEnum):
    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


class LogFormat(enum.StrEnum):
    json = "json"
    plain = "plain"


DEFAULT_LOG_LEVEL, DEFAULT_LOG_FORMAT = LogLevel(DEFAULTS.log_level), LogFormat(DEFAULTS.log_format)


@app.command()
def crd(
    reference: Annotated[
        bool, typer.Option("--reference", help="Print docs/reference.md's Markdown field reference instead.")
    ] = False,
) -> None:
    """Print the TrainingJob CustomResourceDefinition generated from the API models."""
    from kubetrain.api.crd import crd_yaml, reference_markdown

    typer.echo(reference_markdown() if reference else crd_yaml(), nl=False)


@app.command()
def validate(files: Annotated[list[Path], typer.Argument(help="TrainingJob YAML files.")]) -> None:
    """Validate TrainingJob manifests against the API models (the same checks as the CRD)."""
    from kubetrain.api.manifest import InvalidTrainingJob, load

    failed = False
    for path in files:
        try:
            job = load(path)
        except InvalidTrainingJob as error:
            typer.echo(str(error), err=True)
            failed = True
            continue
        typer.echo(
            f"{path}: valid TrainingJob {job.metadata.name} ({job.spec.nodes} nodes x "
            f"{job.spec.procs_per_node} processes)"
        )
    raise typer.Exit(1 if failed else 0)


@app.command()
def run(
    file: Annotated[Path, typer.Argument(help="The TrainingJob YAML you would kubectl apply.")],
    local: Annotated[bool, typer.Option("--local", help="Run the job's pods as processes on this machine.")] = False,
    nodes: Annotated[int | None, typer.Option(help="Override spec.nodes.")] = None,
    gpus_per_node: Annotated[int | None, typer.Option(help="Override spec.gpusPerNode.")] = None,
    run_dir: Annotated[
        Path | None,
        typer.Option(help="Run directory (default runs/<job>-<time>/); an existing one resumes its checkpoints."),
    ] = None,
    netns: Annotated[
        bool, typer.Option("--netns", help="Root only: each node in its own network namespace and address.")
    ] = False,
    volume: Annotated[
        list[str] | None,
        typer.Option(help="NAME=DIR: a spec.template volume as a local directory (PVCs, ConfigMaps, Secrets need it)."),
    ] = None,
    no_image: Annotated[
        bool, typer.Option("--no-image", help="Run a job with imagePullSecrets in this environment anyway.")
    ] = False,
    no_init_containers: Annotated[
        bool, typer.Option("--no-init-containers", help="Run a job with initContainers without them.")
    ] = False,
    straggler_timeout: Annotated[
        float | None,
        typer.Option(
            min=1,
            help="Seconds a node may run on after rank 0's done (work saved) before it is stopped "
            f"[default: {DEFAULTS.straggler_timeout_seconds:g}].",
        ),
    ] = None,
) -> None:
    """Run a TrainingJob locally: the operator's pods as processes, same env, same gang restarts.

    Exit codes: 0 succeeded, 1 failed (as the operator would fail it; the last line names the
    node, its exit code and its log), 2 invalid input (nothing was started), 128+N stopped by
    signal N (130 for Ctrl-C). The run dir's status.json is the job's status as on a cluster.
    """
    if not local:
        typer.echo(f"on a cluster: kubectl apply -f {file}; on this machine: kubetrain run {file} --local", err=True)
        raise typer.Exit(2)
    from kubetrain.local.run import run_local
    from kubetrain.local.volumes import LocalChoices
    from kubetrain.operator.decision import DEFAULT_POLICY

    choices = LocalChoices(tuple(volume or ()), no_image=no_image, no_init_containers=no_init_containers)
    policy = DEFAULT_POLICY
    if straggler_timeout is not None:
        policy = replace(policy, straggler_timeout=timedelta(seconds=straggler_timeout))
    raise typer.Exit(
        run_local(
            file, nodes=nodes, gpus_per_node=gpus_per_node, run_dir=run_dir, netns=netns, choices=choices, policy=policy
        )
    )


@app.command()
def plot(
    run_dir: Annotated[Path, typer.Argument(help="A run directory (or a metrics.jsonl file).")],
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="PNG path (default RUN_DIR/metrics.png).")
    ] = None,
) -> None:
    """Draw the loss and accuracy curves of a run from rank 0's metrics."""
    from kubetrain.local.plot import plot_run

    try:
        path = plot_run(run_dir, output)
    except (OSError, ValueError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from None
    typer.echo(str(path))


@app.command()
def logs(
    job: Annotated[str, typer.Argument(help="TrainingJob name.")],
    namespace: Annotated[str, typer.Option("--namespace", "-n", help="Namespace of the job.")] = "default",
    follow: Annotated[
        bool,
        typer.Option("--follow", "-f", help="Stream every node's log, across gang restarts, until the job ends."),
    ] = False,
    rank: Annotated[int | None, typer.Option("--rank", min=0, help="Only this node's log.")] = None,
    attempt: Annotated[
        int | None,
        typer.Option("--attempt", min=0, help="This attempt's logs (default: the current one); -f starts there."),
    ] = None,
    previous_attempt: Annotated[
        bool, typer.Option("--previous-attempt", help="The attempt before the current one (--attempt CURRENT-1).")
    ] = False,
    tail: Annotated[
        int | None, typer.Option("--tail", min=0, help="Last N lines of each log (--previous-attempt: 50).")
    ] = None,
    kubeconfig: Annotated[
        Path | None,
        typer.Option(help="kubeconfig file (default: KUBECONFIG, else ~/.kube/config; in a pod its ServiceAccount)."),
    ] = None,
) -> None:
    """Print every node's log of one attempt of a TrainingJob from the cluster.

    Each line starts with its node (node-0, node-1, ...) as `kubetrain run --local` shows it;
    with -f with its attempt too (\\[attempt 1 node-0]). A node's log comes from its pod while
    the pod exists, else from the attempt's log archive (the ConfigMap JOB-attempt-N-logs the
    operator keeps each deleted pod's log tail in). Exit codes: 0 every asked-for node's log was
    read; 1 the job is missing, the attempt has no pods and no archive, or a node has no log
    (its reason, e.g. ImagePullBackOff, is said on stderr).
    """
    from kubetrain.client.logs import Cluster, LogsError, api_client, run_logs

    try:
        with api_client(kubeconfig) as api:
            code = run_logs(
                Cluster(api, namespace),
                job,
                rank=rank,
                attempt=attempt,
                previous=previous_attempt,
                follow=follow,
                tail=tail,
                out=sys.stdout,
                err=sys.stderr,
            )
    except LogsError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from None
    raise typer.Exit(code)


@app.command("operator")
def operator_(
    namespaces: Annotated[
        str,
        typer.Option(
            "--namespaces",
            envvar="KUBETRAIN_WATCH_NAMESPACES",
            help="Comma-separated namespaces to watch; empty: every namespace (cluster-wide).",
        ),
    ] = ",".join(DEFAULTS.namespaces),
    trainer_image: Annotated[
        str, typer.Option(envvar="KUBETRAIN_TRAINER_IMAGE", help="Image for TrainingJobs that set no spec.image.")
    ] = DEFAULTS.render.default_image,
    runtime_image: Annotated[
        str,
        typer.Option(
            envvar="KUBETRAIN_RUNTIME_IMAGE",
            help="Image of the init container that gives training pods kubetrain's runtime (spec.runtime.inject); "
            "empty: no pod gets it.",
        ),
    ] = DEFAULTS.render.runtime_image,
    cluster_domain: Annotated[
        str, typer.Option(envvar="KUBETRAIN_CLUSTER_DOMAIN", help="Cluster DNS domain of the rendezvous address.")
    ] = DEFAULTS.render.cluster_domain,
    metrics_port: Annotated[
        int,
        typer.Option(
            envvar="KUBETRAIN_METRICS_PORT", min=0, max=65535, help="Prometheus /metrics port; 0 disables it."
        ),
    ] = DEFAULTS.metrics_port,
    health_port: Annotated[
        int,
        typer.Option(
            envvar="KUBETRAIN_HEALTH_PORT",
            min=0,
            max=65535,
            help="Port of the probes: /healthz (liveness) and /readyz (readiness); 0 disables them.",
        ),
    ] = DEFAULTS.health_port,
    stuck_timeout: Annotated[
        float,
        typer.Option(
            envvar="KUBETRAIN_STUCK_TIMEOUT_SECONDS",
            min=1,
            help="Seconds a pod may wait in ImagePullBackOff/CrashLoopBackOff before the gang restarts.",
        ),
    ] = DEFAULTS.stuck_timeout_seconds,
    straggler_timeout: Annotated[
        float,
        typer.Option(
            envvar="KUBETRAIN_STRAGGLER_TIMEOUT_SECONDS",
            min=1,
            help="Seconds a pod may run on after rank 0's done (work saved) before it is deleted and the job succeeds.",
        ),
    ] = DEFAULTS.straggler_timeout_seconds,
    progress_interval: Annotated[
        float,
        typer.Option(
            envvar="KUBETRAIN_PROGRESS_INTERVAL_SECONDS",
            min=1,
            help="How often rank 0's log is read for status.progress.",
        ),
    ] = DEFAULTS.progress_interval_seconds,
    workers: Annotated[
        int,
        typer.Option(
            envvar="KUBETRAIN_WORKERS",
            min=1,
            max=256,
            help="Jobs creating their pods at once; the others wait their turn.",
        ),
    ] = DEFAULTS.workers,
    leader_elect: Annotated[
        bool,
        typer.Option(
            "--leader-elect/--no-leader-elect",
            envvar="KUBETRAIN_LEADER_ELECT",
            help="Reconcile only while holding the leader Lease (run several replicas); "
            "--no-leader-elect: always (exactly one replica, e.g. against a test cluster).",
        ),
    ] = DEFAULTS.leader_elect,
    lease_name: Annotated[
        str,
        typer.Option("--leader-elect-resource-name", envvar="KUBETRAIN_LEASE_NAME", help="Name of the leader Lease."),
    ] = DEFAULTS.lease_name,
    lease_namespace: Annotated[
        str,
        typer.Option(
            "--leader-elect-resource-namespace",
            envvar="KUBETRAIN_LEASE_NAMESPACE",
            help="Namespace of the leader Lease; empty: the operator's own (in a pod), else the kubeconfig's.",
        ),
    ] = DEFAULTS.lease_namespace,
    lease_duration: Annotated[
        float,
        typer.Option(
            "--leader-elect-lease-duration",
            envvar="KUBETRAIN_LEASE_DURATION_SECONDS",
            help="Seconds after the leader's last renewal before a standby takes over (a killed leader).",
        ),
    ] = DEFAULTS.lease.duration,
    renew_deadline: Annotated[
        float,
        typer.Option(
            "--leader-elect-renew-deadline",
            envvar="KUBETRAIN_LEASE_RENEW_DEADLINE_SECONDS",
            help="Seconds the leader keeps writing without a successful renewal; below the lease duration.",
        ),
    ] = DEFAULTS.lease.renew_deadline,
    retry_period: Annotated[
        float,
        typer.Option(
            "--leader-elect-retry-period",
            envvar="KUBETRAIN_LEASE_RETRY_PERIOD_SECONDS",
            help="Seconds between the leader's renewals and a standby's tries.",
        ),
    ] = DEFAULTS.lease.retry_period,
    log_level: Annotated[
        LogLevel, typer.Option(envvar="KUBETRAIN_LOG_LEVEL", case_sensitive=False, help="Log level.")
    ] = DEFAULT_LOG_LEVEL,
    log_format: Annotated[
        LogFormat, typer.Option(envvar="KUBETRAIN_LOG_FORMAT", help="Log format.")
    ] = DEFAULT_LOG_FORMAT,
) -> None:
    """Run the TrainingJob operator against the current kubeconfig (in a pod: its ServiceAccount).

    Run several replicas: the one holding the leader Lease reconciles, the others stand by with
    warm caches (docs/operator-ha.md).
    """
    from kubetrain.operator.run import run_operator
    from kubetrain.operator.settings import LeaseTiming, OperatorSettings, RenderSettings

    try:
        lease = LeaseTiming(duration=lease_duration, renew_deadline=renew_deadline, retry_period=retry_period)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    settings = OperatorSettings(
        namespaces=tuple(n.strip() for n in namespaces.split(",") if n.strip()),
        render=RenderSettings(cluster_domain=cluster_domain, default_image=trainer_image, runtime_image=runtime_image),
        stuck_timeout_seconds=stuck_timeout,
        straggler_timeout_seconds=straggler_timeout,
        progress_interval_seconds=progress_interval,
        metrics_port=metrics_port,
        health_port=health_port,
        workers=workers,
        log_format=log_format.value,
        log_level=log_level.value,
        leader_elect=leader_elect,
        lease_name=lease_name,
        lease_namespace=lease_namespace,
        lease=lease,
    )
    raise typer.Exit(run_operator(settings))
