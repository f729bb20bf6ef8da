"""The real node leaves the host as it found it, and the check that says so can fail: a
leftover iptables chain shows in the differences, and undo removes it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from support import hoststate
from support import node as real
from support.nodeconfig import BRIDGE
from support.nodepods import node_or_skip, restricted_namespace, run_pod, scratch_pod

pytestmark = pytest.mark.node
CHAIN = "KUBETRAIN-TEST-LEFTOVER"


def test_a_leftover_chain_and_its_jump_rule_show_as_differences_and_undo_removes_them() -> None:
    node_or_skip()
    # Under the node lock: no other session's node changes the host meanwhile.
    with real.host_lock():
        before = hoststate.snapshot()
        try:
            subprocess.run(["iptables", "-t", "filter", "-N", CHAIN], check=True)
            subprocess.run(["iptables", "-t", "filter", "-A", "INPUT", "-j", CHAIN], check=True)
            assert hoststate.differences(before, hoststate.snapshot()) == [
                f"iptables ipv4 filter: + :{CHAIN} -",
                f"iptables ipv4 filter: + -A INPUT -j {CHAIN}",
            ]
            hoststate.undo_iptables(before)
            assert hoststate.differences(before, hoststate.snapshot()) == []
        finally:
            subprocess.run(["iptables", "-t", "filter", "-D", "INPUT", "-j", CHAIN], check=False, capture_output=True)
            subprocess.run(["iptables", "-t", "filter", "-X", CHAIN], check=False, capture_output=True)


def test_teardown_leaves_the_host_as_it_found_it(scratch_archive: Path) -> None:
    # running_node compares the host after teardown with its snapshot before and raises on any
    # difference; this test makes sure there was something to undo.
    with real.running_node() as node:
        node.load_images([scratch_archive])
        ns = restricted_namespace(node, "host-state")
        run_pod(node, ns, scratch_pod("pod", ["hello", "1"]))
        during = "\n".join(hoststate.differences(node.host_before, hoststate.snapshot(node.host_roots)))
        for change in (f"links: + {BRIDGE}", "links: + veth", "mounts: + /run/netns/", "cgroups: + /sys/fs/cgroup/"):
            assert change in during, during
    print(f"\nreal node teardown: {node.timings['teardown']:.1f} s")
