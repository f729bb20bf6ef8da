"""Fixtures of the real-node tests: a node per module (tests/support/node.py) and the
workload image, one static C program (scratch.c) alone in a FROM-scratch image."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import node as real
from support import ociimage
from support.node import RealNode
from support.nodepods import SCRATCH_IMAGE

HERE = Path(__file__).resolve().parent


def node_or_skip() -> None:
    reason = real.missing()
    if reason:
        # A `cluster` test: under KUBETRAIN_REQUIRE_CONTROL_PLANE=1 this skip is a failure.
        pytest.skip(f"no real node: {reason}")


@pytest.fixture(scope="session")
def scratch_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    node_or_skip()
    out = tmp_path_factory.mktemp("scratch-image")
    subprocess.run(["gcc", "-Os", "-static", "-o", str(out / "scratch"), str(HERE / "scratch.c")],
                   check=True, capture_output=True)  # fmt: skip
    return ociimage.scratch_image(SCRATCH_IMAGE, {"/scratch": out / "scratch"}, ["/scratch"], out / "scratch.tar")


@pytest.fixture(scope="module")
def real_node(scratch_archive: Path) -> Iterator[RealNode]:
    """A node with the scratch image loaded; its start timings and memory are printed."""
    with real.running_node() as node:
        node.load_images([scratch_archive])
        timings = {k: round(v, 1) for k, v in node.timings.items() if k != "t0"}
        print(f"\nreal node up: {timings} s; RSS MiB { ({k: round(v) for k, v in node.rss_mib().items()}) }")
        yield node
