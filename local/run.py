"""`kubetrain run FILE --local`: plan, optional network namespaces, supervise, plot, summarize."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TextIO

from kubetrain.api.manifest import InvalidTrainingJob
from kubetrain.local import netns as netns_mod
from kubetrain.local.localize import LocalRunError
from kubetrain.local.plan import LocalPlan, check_commands, claim_run_dir, make_plan, write_run_files
from kubetrain.local.plot import plot_run
from kubetrain.local.result import EXIT_BAD_INPUT, EXIT_FAILED
from kubetrain.local.supervisor import NodeStartError, Supervisor
from kubetrain.local.view import PlainView, make_view
from kubetrain.local.volumes import NO_CHOICES, LocalChoices, UnmappableError
from kubetrain.operator.decision import DEFAULT_POLICY, Policy


def run_local(
    path: str | Path,
    *,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    run_dir: Path | None = None,
    netns: bool = False,
    choices: LocalChoices = NO_CHOICES,
    policy: Policy = DEFAULT_POLICY,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """`kubetrain run FILE --local`; returns the exit code (see kubetrain.local.result)."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        plan = make_plan(
            path,
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            run_dir=run_dir,
            now=time.strftime("%Y%m%d-%H%M%S"),
            choices=choices,
        )
        check_commands(plan)
    except (InvalidTrainingJob, LocalRunError, UnmappableError) as error:
        print(f"error: {error}", file=err)
        return EXIT_BAD_INPUT
    with contextlib.ExitStack() as stack:
        if netns:
            try:
                plan = in_namespaces(plan, stack)
            except netns_mod.NetnsError as error:
                print(f"error: --netns: {error}", file=err)
                return EXIT_BAD_INPUT
        if run_dir is None:
            plan = replace(plan, run_dir=claim_run_dir(plan.run_dir))
        write_run_files(plan, plan.nodes(attempt=0, master_port=plan.job.spec.master_port))
        return supervise(plan, out, err, policy)


def in_namespaces(plan: LocalPlan, stack: contextlib.ExitStack) -> LocalPlan:
    """The plan with each node in a network namespace of its own (removed when `stack` closes)."""
    pods = plan.pods(attempt=0)
    namespaces = stack.enter_context(
        netns_mod.node_namespaces(plan.job.name, [netns_mod.pod_hostnames(pod) for pod in pods])
    )
    return replace(
        plan,
        node_addrs=[ns.addr for ns in namespaces],
        netns=[ns.name for ns in namespaces],
        socket_ifname=netns_mod.NODE_IFNAME,
    )


def supervise(plan: LocalPlan, out: TextIO, err: TextIO, policy: Policy = DEFAULT_POLICY) -> int:
    """Run the gang to its end, then the plot and the summary; returns the exit code."""
    view = make_view(out)
    return run_supervisor(Supervisor(plan, view, policy=policy), view, err)


def run_supervisor(supervisor: Supervisor, view: PlainView, err: TextIO) -> int:
    """`supervise` with a Supervisor made by the caller (kubetrain.client keeps it, to read its
    nodes' phases and to stop it from another thread)."""
    plan = supervisor.plan
    try:
        view.begin(plan)
        for line in plan.volumes.describe(plan.run_dir):
            view.notice(line)
        try:
            result = supervisor.run()
        except NodeStartError as error:
            view.close()
            print(f"error: {error}", file=err)
            return EXIT_FAILED
        try:
            result.plot = str(plot_run(plan.run_dir))
        except (OSError, ValueError, ImportError) as error:
            view.notice(f"no plot: {error}")
        (plan.run_dir / "summary.json").write_text(json.dumps(result.to_json(), indent=2) + "\n")
        view.end(result)
    finally:
        view.close()
    return result.exit_code
