"""The `kubetrain` command line. The commands live in `kubetrain.cli.main`; this entry point
only says which extra is missing where an image was installed without the CLI (the trainer
image carries the API and the trainer, not typer)."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from kubetrain.cli.main import app
    except ModuleNotFoundError as error:
        sys.exit(f"kubetrain: the command line needs {error.name!r}: pip install 'kubetrain[local]'")
    app()
