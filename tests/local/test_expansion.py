"""`$(VAR)` references in command, args and env, expanded as the kubelet expands them (rules of
k8s.io/kubernetes third_party/forked/golang/expansion) with the local values."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.jobs import fake_job, write_job

from kubetrain.local import plan as local
from kubetrain.local.localize import expand, expand_env

pytestmark = pytest.mark.unit

VARS = {"A": "a", "B": "b", "EMPTY": "", "WITH SPACE": "s", "DOLLAR": "$(A)"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$(A)", "a"),
        ("x$(A)y$(B)z", "xaybz"),
        ("$(A)$(B)", "ab"),
        ("$(EMPTY)", ""),
        ("$(UNKNOWN)", "$(UNKNOWN)"),  # unknown names stay as they are
        ("$(UNKNOWN)$(A)", "$(UNKNOWN)a"),
        ("$$(A)", "$(A)"),  # `$$` escapes: the reference is not expanded
        ("$$$(A)", "$a"),
        ("$$$$(A)", "$$(A)"),
        ("$$", "$"),
        ("a$$b", "a$b"),
        ("$", "$"),  # a trailing `$` stays
        ("a$", "a$"),
        ("$A", "$A"),  # `$` followed by anything but `$` or `(`: kept with that character
        ("${A}", "${A}"),
        ("$(A", "$(A"),  # no closing parenthesis: kept
        ("$($$", "$($"),  # ... and scanning goes on after the `$(`
        ("$()", "$()"),
        ("$(WITH SPACE)", "s"),  # the name is whatever stands before the first `)`
        ("$(A $(B)", "$(A $(B)"),
        ("$(DOLLAR)", "$(A)"),  # values are not expanded again
        ("€$(A)€", "€a€"),
        ("", ""),
    ],
)
def test_expand(text: str, expected: str) -> None:
    assert expand(text, VARS) == expected


def test_env_values_see_only_the_variables_defined_before_them() -> None:
    env = {"FIRST": "$(LATER)", "LATER": "1", "SECOND": "$(LATER)-$(FIRST)", "FIELD": "$(LATER)"}
    assert expand_env(env, literal={"FIRST", "LATER", "SECOND"}) == {
        "FIRST": "$(LATER)",
        "LATER": "1",
        "SECOND": "1-$(LATER)",
        "FIELD": "$(LATER)",  # a valueFrom value is taken as it is
    }


def test_command_args_and_env_get_the_local_values(tmp_path: Path) -> None:
    job = fake_job(
        "pass",
        args=["--node_rank=$(NODE_RANK)", "--master=$(MASTER_ADDR):$(MASTER_PORT)", "$$(NODE_RANK)", "$(NOPE)"],
        env=[{"name": "WHERE", "value": "$(KUBETRAIN_CHECKPOINT_DIR)/rank-$(NODE_RANK)"}],
    )
    nodes = local.make_plan(write_job(tmp_path, job), run_dir=tmp_path / "run").nodes(attempt=0, master_port=4242)
    assert nodes[1].argv[3:] == ["--node_rank=1", "--master=127.0.0.1:4242", "$(NODE_RANK)", "$(NOPE)"]
    assert nodes[1].env["WHERE"] == f"{(tmp_path / 'run' / 'checkpoints').resolve()}/rank-1"
