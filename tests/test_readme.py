"""The README stays true: its field reference, its two commands and CI's use of them."""

from __future__ import annotations

import re
from pathlib import Path

from kubetrain.api.contract import RESERVED_ENV
from kubetrain.api.crd import reference_markdown

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()


def between(start: str, end: str) -> str:
    return README.split(start, 1)[1].split(end, 1)[0]


def test_field_reference_matches_the_models() -> None:
    assert between("<!-- crd-reference:start -->\n", "<!-- crd-reference:end -->") == reference_markdown(), (
        "README's field reference drifted: paste the output of `kubetrain crd --reference`"
    )


def test_quick_start_has_exactly_two_commands() -> None:
    quick_start = between("## Quick start", "\n## ")
    blocks = re.findall(r"```bash\n(.*?)```", quick_start, re.DOTALL)
    commands = [line for block in blocks for line in block.splitlines() if line.strip()]
    assert len(commands) == 2, commands
    assert "kubetrain run examples/" in commands[0] and "--local" in commands[0]
    assert commands[1] == "bash tests/run.sh"
    assert "bash tests/run.sh" in (ROOT / ".ci" / "run").read_text()


def test_env_contract_table_names_every_reserved_variable() -> None:
    table = between("## The env contract", "\n## ")
    for name in RESERVED_ENV:
        assert f"`{name}`" in table, name
