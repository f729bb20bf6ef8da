"""Which tests share a pytest-xdist worker in the waiting tiers: a pytest plugin (registered by
tests/conftest.py).

tests/run.sh runs the tiers above `train` (cluster, node, e2e, bench) as
`-n WORKERS --dist loadscope --no-loadscope-reorder`: they mostly wait (kubelet syncs, back-offs,
grace periods, jobs that sleep per step), so side by side they take the time of the longest
group instead of the sum. Each worker has a control plane of its own (a session fixture, on free
ports), so no two workers share the API's cluster-scoped objects; the groups are:

  real-node  every module that starts the real node (tests/node/, tests/e2e/): one node per host
             (its bridge, IPs and ports are fixed: tests/support/node.py's host lock), so they
             run one after another on one worker, and first, since they are the longest group
  a module   every other module runs whole on one worker: its module fixtures (an operator, a
             namespace, CRDs) start once

Under `--dist loadscope` these groups are the scopes (a scheduler of xdist's own kind, with its
scope rule replaced); other modes and runs without xdist ignore them. Not xdist's `xdist_group`
marks: with pytest 9.2 they group nothing (xdist 3.8 renames `item._nodeid`, which pytest no longer
reads), so `--dist loadgroup` spreads a group's tests over every worker.
"""

from __future__ import annotations

from typing import Any

import pytest

REAL_NODE_GROUP = "real-node"
# Where the modules that start the real node live (tests/test_worker_groups.py checks that no
# module elsewhere imports the node's support modules).
REAL_NODE_DIRS = ("tests/node/", "tests/e2e/")


def group_of(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]  # relative to the repository's root (pyproject's rootdir)
    return REAL_NODE_GROUP if path.startswith(REAL_NODE_DIRS) else path


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getoption("dist", "no") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return ByGroup(config, log)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("dist", "no") == "loadscope":
        # The longest group first (stable: the rest keep their order); every worker sorts alike,
        # and the scheduler hands out the scopes in this order.
        items.sort(key=lambda item: group_of(item.nodeid) != REAL_NODE_GROUP)
