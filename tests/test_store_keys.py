"""One home for the gang store's wire (kubetrain.runtime.store, the store's counterpart of
kubetrain.api.contract): every `kubetrain/...` key kubetrain keeps in the store torchrun's rendezvous
gives, and the attempt a process runs as, are spelled there and nowhere else. A key written in one
module and read under a second spelling in another, or an attempt read two ways, drifts apart
silently: an agent that checks a key no worker writes waits for nothing."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from kubetrain.runtime import store

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("api", "runtime", "trainer", "local", "operator")
HOME = ROOT / "runtime" / "store.py"
CONTRACT = ROOT / "api" / "contract.py"
# A whole string that is a key of ours or its start: `kubetrain/`, then key-like segments (an
# f-string's fields read as `{}`). Not an image (`kubetrain/trainer:0.1.0`: a ':' or '@') nor a
# file path ("/kubetrain/function": a leading '/'), nor prose.
KEY = re.compile(r"kubetrain/[\w\-/{}]*")
ATTEMPT_NAMES = {"KUBETRAIN_ATTEMPT": CONTRACT, "TORCHELASTIC_RESTART_COUNT": HOME}
ATTEMPT_ENV = "ATTEMPT_ENV"
READS = {"get", "getenv", "pop"}


def _text(node: ast.JoinedStr) -> str:
    return "".join(part.value if isinstance(part, ast.Constant) else "{}" for part in node.values)


def _is_attempt_env(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == ATTEMPT_ENV) or (
        isinstance(node, ast.Attribute) and node.attr == ATTEMPT_ENV
    )


def spelled(path: Path) -> list[str]:
    """What `path` spells of the store's wire: `key '...'` for a key-shaped string, `prefix` for a
    PrefixStore made on a string of its own, `name '...'` for an attempt variable's name and
    `read` for a read of ATTEMPT_ENV from an environment; each with its line."""
    tree = ast.parse(path.read_text(), str(path))
    in_fstrings = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
    found = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.JoinedStr) or (
            isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in in_fstrings
        ):
            text = _text(node) if isinstance(node, ast.JoinedStr) else str(node.value)
            if KEY.fullmatch(text):
                found.append(f"{line}: key {text!r}")
            if text in ATTEMPT_NAMES:
                found.append(f"{line}: name {text!r}")
        elif isinstance(node, ast.Call):
            callee = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if callee == "PrefixStore" and node.args and isinstance(node.args[0], ast.Constant | ast.JoinedStr):
                found.append(f"{line}: prefix")
            if callee in READS and node.args and _is_attempt_env(node.args[0]):
                found.append(f"{line}: read")
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _is_attempt_env(node.slice):
            found.append(f"{line}: read")
    return found


def test_the_detector_finds_what_the_homes_spell() -> None:
    """The scan below finds nothing only because nothing is there, not because it is blind."""
    home = spelled(HOME)
    assert sum(": key 'kubetrain/" in entry for entry in home) >= 3, home
    assert any(": read" in entry for entry in home), home
    assert any("name 'TORCHELASTIC_RESTART_COUNT'" in entry for entry in home), home
    assert any("name 'KUBETRAIN_ATTEMPT'" in entry for entry in spelled(CONTRACT))


def test_the_store_keys_and_the_attempt_are_spelled_in_their_homes_only() -> None:
    elsewhere = {
        str(path.relative_to(ROOT)): [
            entry for entry in spelled(path) if not (path == CONTRACT and "name 'KUBETRAIN_ATTEMPT'" in entry)
        ]
        for folder in SCANNED
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path != HOME
    }
    assert {path: entries for path, entries in elsewhere.items() if entries} == {}


# The wire itself, read: an agent and its workers (of one runtime) meet on exactly these.
def test_the_keys() -> None:
    assert {
        "failed": store.failed_key(3),
        "report": store.report_key(3, 1),
        "registered": store.registered_key(3),
        "next": store.next_attempt_key(3),
        "armed": store.armed_key(3),
        "survivor": store.survivor_key(3, 2),
        "joined": store.joined_key("job", 5, 1),
        "go": store.go_key("job", 5),
        "abandoned": store.abandoned_key("job", 5),
        "trainer": store.trainer_prefix(2),
        "script": store.script_prefix(2),
        "exit barrier": store.run_key("job", "torchelastic/agent/terminal_state/num_members"),
    } == {
        "failed": "kubetrain/gang/3/failed",
        "report": "kubetrain/gang/3/node/1",
        "registered": "kubetrain/gang/3/registered",
        "next": "kubetrain/gang/3/next",
        "armed": "kubetrain/gang/3/survivor-save",
        "survivor": "kubetrain/gang/3/survivor/2",
        "joined": "kubetrain/gang/join/job/5/1",
        "go": "kubetrain/gang/join/job/5/go",
        "abandoned": "kubetrain/gang/join/job/5/abandoned",
        "trainer": "kubetrain/attempt_2",
        "script": "kubetrain/script/attempt_2",
        "exit barrier": "job/torchelastic/agent/terminal_state/num_members",
    }


@pytest.mark.parametrize(
    ("environ", "gang", "restarts"),
    [
        ({}, None, 0),  # outside a kubetrain job, outside torchrun
        ({"KUBETRAIN_ATTEMPT": "4", "TORCHELASTIC_RESTART_COUNT": "2"}, 4, 2),  # two counts, apart
        ({"KUBETRAIN_ATTEMPT": "", "TORCHELASTIC_RESTART_COUNT": ""}, None, 0),
        ({"KUBETRAIN_ATTEMPT": "x", "TORCHELASTIC_RESTART_COUNT": "-1"}, None, 0),  # not a count
        ({"KUBETRAIN_ATTEMPT": "0"}, 0, 0),
    ],
)
def test_the_attempt_and_torchruns_restart_count(environ: dict[str, str], gang: int | None, restarts: int) -> None:
    assert store.gang_attempt(environ) == gang
    assert store.restart_count(environ) == restarts
