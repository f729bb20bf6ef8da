"""Fixtures of the real-node tests: a node per module (tests/support/node.py) and the
workload image, one static C program (scratch.c) alone in a FROM-scratch image; TrainingJobs on
a node with the operator of this tree (support/realjobs.py), in the module's NAMESPACE."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support import node as real
from support import nodepods
from support.controlplane import Unavailable
from support.node import RealNode
from support.realjobs import RealJobs, real_jobs


@pytest.fixture(scope="session")
def scratch_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    nodepods.node_or_skip()
    return nodepods.scratch_archive(tmp_path_factory.mktemp("scratch-image"))


@pytest.fixture(scope="module")
def real_node(scratch_archive: Path) -> Iterator[RealNode]:
    """A node with the scratch image loaded; its start timings and memory are printed."""
    with real.running_node() as node:
        node.load_images([scratch_archive])
        timings = {k: round(v, 1) for k, v in node.timings.items() if k != "t0"}
        rss = {k: round(v) for k, v in node.rss_mib().items()}
        print(f"\nreal node up: {timings} s; RSS MiB {rss}")
        yield node


@pytest.fixture(scope="module")
def jobs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealJobs]:
    """The real node, the images and this tree's operator watching the module's NAMESPACE; skips,
    naming what is missing (root, the node's binaries, the images)."""
    nodepods.node_or_skip()
    namespace: str = request.module.NAMESPACE
    try:
        with real_jobs(tmp_path_factory.mktemp(namespace), namespace) as running:
            yield running
    except Unavailable as missing:
        pytest.skip(str(missing))
