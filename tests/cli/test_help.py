"""Every command's --help shows what its docstring says: Typer renders help as Rich markup, which
takes `[words]` for a style tag and drops it (`\\[` in a docstring keeps the bracket)."""

from __future__ import annotations

import re

import click
import pytest
from typer.main import get_command
from typer.testing import CliRunner

from kubetrain.cli.main import app

pytestmark = pytest.mark.unit

COMMANDS = sorted(get_command(app).commands.items())  # type: ignore[attr-defined]


@pytest.mark.parametrize(("name", "command"), COMMANDS, ids=[name for name, _ in COMMANDS])
def test_bracketed_words_of_a_help_text_are_shown(name: str, command: click.Command) -> None:
    doc = getattr(command.callback, "__doc__", None) or ""
    bracketed = [text.replace("\\[", "[") for text in re.findall(r"\\?\[[^\]\n]*\]", doc)]
    shown = CliRunner().invoke(app, [name, "--help"], env={"COLUMNS": "300"}).output
    flat = " ".join(shown.split())
    for text in bracketed:
        assert text in flat, f"kubetrain {name} --help lost {text!r}"
