"""Fixtures of the trainer's multi-process tests; the launcher itself is support.trainer_runs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from support.trainer_runs import Launcher, digits_config

from kubetrain.local.processes import subreaper


@pytest.fixture
def launcher() -> Iterator[Launcher]:
    launch = Launcher()
    # Workers orphaned by a dead torchrun are re-parented to the test process, where cleanup finds them.
    with subreaper():
        try:
            yield launch
        finally:
            launch.cleanup()


@pytest.fixture
def make_config() -> Any:
    return digits_config
