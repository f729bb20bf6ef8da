"""README.md and docs/ stay true: the README is a page (its Quick start's two commands, CI's use
of the second, its first TrainingJob the example's), the field reference is the generated one,
every command of a ```bash block parses and names files that exist, every relative link and
anchor resolves."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from support.jobs import DIGITS_CPU, training_job
from support.tiers import TIERS

from kubetrain.api.contract import RESERVED_ENV
from kubetrain.api.crd import reference_markdown
from kubetrain.api.models import TrainingJob
from kubetrain.cli.main import app

pytestmark = pytest.mark.unit

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
IDS = [str(doc.relative_to(ROOT)) for doc in DOCS]


def between(text: str, start: str, end: str) -> str:
    return text.split(start, 1)[1].split(end, 1)[0]


def blocks(doc: Path, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", doc.read_text(), re.DOTALL | re.MULTILINE)


def test_the_readme_is_one_page() -> None:
    assert len(README.read_text().splitlines()) <= 250, "README.md is a user's page: the reference goes in docs/"


def test_field_reference_matches_the_models() -> None:
    reference = (ROOT / "docs" / "reference.md").read_text()
    assert between(reference, "<!-- crd-reference:start -->\n", "<!-- crd-reference:end -->") == reference_markdown(), (
        "docs/reference.md's field reference drifted: paste the output of `kubetrain crd --reference`"
    )


def test_quick_start_has_exactly_two_commands() -> None:
    quick_start = between(README.read_text(), "## Quick start", "\n## ")
    commands = [
        line for block in re.findall(r"```bash\n(.*?)```", quick_start, re.DOTALL) for line in block.splitlines()
    ]
    assert len(commands) == 2, commands
    assert "kubetrain run examples/" in commands[0] and "--local" in commands[0]
    assert commands[1] == "bash tests/run.sh"
    assert "bash tests/run.sh" in (ROOT / ".ci" / "run").read_text()


def test_the_first_training_job_is_the_examples() -> None:
    [shown] = [doc for block in blocks(README, "yaml") for doc in yaml.safe_load_all(block) if doc.get("kind")]
    assert shown == training_job(DIGITS_CPU), "README's first TrainingJob must be examples/digits-cpu.yaml's"
    TrainingJob.model_validate(shown)


def test_env_contract_table_names_every_reserved_variable() -> None:
    table = (ROOT / "docs" / "env-contract.md").read_text()
    for name in RESERVED_ENV:
        assert f"`{name}`" in table, name


# --- commands -------------------------------------------------------------------------------------

CLI = typer.main.get_command(app)
EXTRAS = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
INSTALL_COMPONENTS = {"k8s", "helm", "kueue", "kubeflow", "node"}
# A word naming a file of this repository: it starts with one of its top-level folders.
REPO_PATH = re.compile(rf"^(?:{'|'.join(p.name for p in ROOT.iterdir() if p.is_dir() and p.name[0] != '.')}|\.ci)/")


def problems_of(command: list[str]) -> list[str]:
    """What is wrong with one command (its words, after any VAR=value): a file it names that is
    missing, an option or subcommand kubetrain does not have, a tier or extra that does not exist."""
    found = [f"{word} does not exist" for word in command if REPO_PATH.match(word) and not list(ROOT.glob(word))]
    program, args = Path(command[0]).name, command[1:]
    if program == "kubetrain" and args:
        context = CLI.make_context("kubetrain", args[:1])
        subcommand = CLI.get_command(context, args[0])
        if subcommand is None:
            return [*found, f"kubetrain has no command {args[0]}"]
        try:
            subcommand.make_context(args[0], args[1:], parent=context)
        except Exception as error:  # typer's own click: its UsageError is not importable as click's
            found.append(f"kubetrain {args[0]}: {getattr(error, 'format_message', error.__str__)()}")
    elif program == "bash" and args[:1] == ["tests/run.sh"] and args[1:2] == ["--tier"]:
        if args[2] not in (*TIERS, "all"):
            found.append(f"tests/run.sh has no tier {args[2]}")
    elif program == "bash" and args[:1] == ["tests/cluster/install.sh"]:
        found += [f"install.sh has no component {word}" for word in args[1:] if word not in INSTALL_COMPONENTS]
    elif program == "pip" or program.startswith("python"):
        extras = {extra for word in args for group in re.findall(r"^\.\[(.*)\]$", word) for extra in group.split(",")}
        found += [f"pyproject has no extra [{extra}]" for extra in sorted(extras - EXTRAS)]
    return found


def commands_in(doc: Path) -> list[list[str]]:
    """Every command of the doc's ```bash blocks: lines split at &&, | and ;, comments dropped."""
    found = []
    for block in blocks(doc, "bash"):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            command: list[str] = []
            for word in [*words, "&&"]:
                if command and command[-1] in (">", ">>", "2>"):  # a redirection: not an argument
                    command.pop()
                elif word in ("&&", "|", ";", "||"):
                    while command and re.match(r"^[A-Z_]+=", command[0]):
                        command.pop(0)
                    if command:
                        found.append(command)
                    command = []
                else:
                    command.append(word)
    return found


@pytest.mark.parametrize("doc", DOCS, ids=IDS)
def test_every_command_is_valid(doc: Path) -> None:
    assert [f"{' '.join(c)}: {p}" for c in commands_in(doc) for p in problems_of(c)] == []


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("kubetrain run examples/nowhere.yaml --local", "examples/nowhere.yaml does not exist"),
        ("kubetrain run examples/digits-cpu.yaml --locall", "No such option: --locall"),
        ("kubetrain logs", "Missing argument"),
        ("kubetrain train job.yaml", "kubetrain has no command train"),
        ("bash tests/run.sh --tier fast", "tests/run.sh has no tier fast"),
        ("bash tests/cluster/install.sh kueue kind", "install.sh has no component kind"),
        (".venv/bin/pip install '.[trainers]'", "pyproject has no extra [trainers]"),
        ("kubectl apply -f examples/nope.yaml   # a comment", "examples/nope.yaml does not exist"),
        ("X=1 bash tests/run.sh --tier unit && kubetrain crd --bogus", "No such option: --bogus"),
    ],
)
def test_a_wrong_command_is_named(tmp_path: Path, line: str, problem: str) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(f"```bash\n{line}\n```\n")
    found = [p for c in commands_in(doc) for p in problems_of(c)]
    assert len(found) == 1 and problem in found[0], found


# --- links ----------------------------------------------------------------------------------------

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(doc: Path) -> set[str]:
    """GitHub's anchor of each heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"^```.*?^```", "", doc.read_text(), flags=re.DOTALL | re.MULTILINE)
    headings = re.findall(r"^#+ (.*)$", text, re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def broken_links(doc: Path) -> list[str]:
    broken = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"^[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        resolved = (doc.parent / path).resolve() if path else doc
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading #{anchor} in {resolved.name}")
    return broken


@pytest.mark.parametrize("doc", DOCS, ids=IDS)
def test_every_relative_link_resolves(doc: Path) -> None:
    assert broken_links(doc) == []


def test_a_broken_link_is_named(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n\n## Its part\n")
    doc = tmp_path / "doc.md"
    links: dict[str, Any] = {
        "other.md": None,
        "other.md#its-part": None,
        "#here": None,
        "https://example.com/x": None,
        "missing.md": "missing.md: no such file",
        "other.md#nowhere": "other.md#nowhere: no heading #nowhere in other.md",
    }
    doc.write_text("# Here\n\n" + " ".join(f"[x]({target})" for target in links) + "\n")
    assert broken_links(doc) == [problem for problem in links.values() if problem]
