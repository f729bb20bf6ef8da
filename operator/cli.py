"""The `kubetrain` command line. Each command imports its machinery lazily: `kubetrain crd`
must not pay for kopf, and nothing here may import torch."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    name="kubetrain",
    help="Kubernetes-native distributed PyTorch training.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.command()
def crd(
    reference: Annotated[
        bool, typer.Option("--reference", help="Print the README's Markdown field reference instead.")
    ] = False,
) -> None:
    """Print the TrainingJob CustomResourceDefinition generated from the API models."""
    from .crd import crd_yaml, reference_markdown

    typer.echo(reference_markdown() if reference else crd_yaml(), nl=False)


@app.command()
def validate(files: Annotated[list[Path], typer.Argument(help="TrainingJob YAML files.")]) -> None:
    """Validate TrainingJob manifests against the API models (the same checks as the CRD)."""
    from .manifest import InvalidTrainingJob, load

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


def main() -> None:
    app()
