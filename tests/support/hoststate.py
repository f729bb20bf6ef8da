"""What a real node changes on the host, as data: a snapshot before, one after, their
differences, and the undo of each kind of change. tests/support/node.py snapshots before it
starts and raises with `differences()` when its teardown left the host otherwise.

What a node touches here (NOTES.md, "A real single node"): network links (its bridge, one
veth per pod), iptables chains (the kubelet's KUBE-*), forwarding and the kernel tunables the
kubelet sets, network-namespace and volume mounts, container log links, CNI state, kubepods
cgroups and /etc/hosts.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

# The kubelet sets these unless protectKernelDefaults (which makes it refuse to start instead).
SYSCTLS = (
    "net/ipv4/ip_forward",
    "net/ipv6/conf/all/forwarding",
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
# Host directories the kubelet, containerd and the CNI plugins write whatever their config says.
WATCHED_DIRS = ("/var/log/containers", "/var/log/pods", "/var/lib/cni", "/run/netns", "/etc/cni")
IPTABLES_TABLES = ("filter", "nat", "mangle")
IPTABLES = {"ipv4": "iptables", "ipv6": "ip6tables"}
CGROUP_ROOT = Path("/sys/fs/cgroup")
# `kubetrain run --local --netns` (local/netns.py) of another test session on this machine
# creates these for a while: its bridge and veths, and namespaces named kubetrain-<job>-<tag>-<rank>.
# They are not the node's, and a node check that saw them would fail at random.
LOCAL_RUNNER_LINK = re.compile(r"^kt[0-9a-f]{4}(br|h\d+|n\d+)$")
LOCAL_RUNNER_NETNS = "kubetrain-"


def _run(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def links() -> list[str]:
    names = (line.split(":")[1].strip().split("@")[0] for line in _run("ip", "-o", "link", "show").splitlines())
    return sorted(name for name in names if not LOCAL_RUNNER_LINK.match(name))


def iptables() -> dict[str, list[str]]:
    """{"ipv4 nat": [chain declarations and rules]} without counters or comments."""
    rules: dict[str, list[str]] = {}
    for family, tool in IPTABLES.items():
        if shutil.which(f"{tool}-save") is None:
            continue
        for table in IPTABLES_TABLES:
            out = _run(f"{tool}-save", "-t", table)
            rules[f"{family} {table}"] = [
                re.sub(r"\s\[\d+:\d+\]$", "", line) for line in out.splitlines() if not line.startswith(("#", "COMMIT"))
            ]
    return rules


def sysctls() -> dict[str, str]:
    values = {}
    for name in SYSCTLS:
        with contextlib.suppress(OSError):
            values[name] = Path("/proc/sys", name).read_text().strip()
    return values


def mounts(roots: Iterable[Path]) -> list[str]:
    """Mount points at or under `roots` (and every network namespace mount)."""
    prefixes = [str(r).rstrip("/") for r in [*roots, Path("/run/netns"), Path("/var/run/netns")]]
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return sorted(
        {
            p
            for p in points
            if any(p == r or p.startswith(r + "/") for r in prefixes)
            and not Path(p).name.startswith(LOCAL_RUNNER_NETNS)
        }
    )


def watched_dirs() -> dict[str, list[str] | None]:
    """Every file under each watched directory (None: the directory does not exist)."""
    listing: dict[str, list[str] | None] = {}
    for top in WATCHED_DIRS:
        root = Path(top)
        files = (str(p.relative_to(root)) for p in root.rglob("*")) if root.is_dir() else None
        listing[top] = None if files is None else sorted(f for f in files if not f.startswith(LOCAL_RUNNER_NETNS))
    return listing


def kubepods_cgroups() -> list[str]:
    return sorted(str(p) for p in CGROUP_ROOT.glob("*/kubepods*")) + sorted(
        str(p) for p in CGROUP_ROOT.glob("kubepods*")
    )


def snapshot(roots: Sequence[Path] = ()) -> dict[str, Any]:
    """The host state a node may change; `roots` are the node's own directories (their mounts)."""
    return {
        "links": links(),
        "iptables": iptables(),
        "sysctls": sysctls(),
        "mounts": mounts(roots),
        "dirs": watched_dirs(),
        "cgroups": kubepods_cgroups(),
        "/etc/hosts": Path("/etc/hosts").read_text(),
    }


def _diff(before: Any, after: Any, path: str) -> list[str]:
    if isinstance(before, dict) and isinstance(after, dict):
        return [d for k in sorted(set(before) | set(after)) for d in _diff(before.get(k), after.get(k), f"{path} {k}")]
    if isinstance(before, list) and isinstance(after, list):
        added = [x for x in after if x not in before]
        removed = [x for x in before if x not in after]
        return [f"{path}: + {x}" for x in added] + [f"{path}: - {x}" for x in removed]
    return [] if before == after else [f"{path}: {before!r} -> {after!r}"]


def differences(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """One line per difference ("iptables nat: + :KUBE-KUBELET-CANARY - ..."), [] when equal."""
    return [line.strip() for line in _diff(before, after, "")]


# --- undo: each removes only what is new since `before` ---------------------------------------
def undo_iptables(before: dict[str, Any]) -> None:
    """Delete the rules that jump to chains created since `before`, then those chains."""
    for key, rules in iptables().items():
        family, table = key.split()
        tool = IPTABLES[family]
        old_chains = {r.split()[0] for r in before["iptables"].get(key, []) if r.startswith(":")}
        new_chains = [r[1:].split()[0] for r in rules if r.startswith(":") and r.split()[0] not in old_chains]
        for rule in rules:
            words = shlex.split(rule)
            if words[:1] == ["-A"] and ("-j" in words and words[words.index("-j") + 1] in new_chains):
                subprocess.run([tool, "-t", table, "-D", *words[1:]], check=False, capture_output=True)
        for chain in new_chains:
            subprocess.run([tool, "-t", table, "-F", chain], check=False, capture_output=True)
        for chain in new_chains:
            subprocess.run([tool, "-t", table, "-X", chain], check=False, capture_output=True)


def undo_sysctls(before: dict[str, Any]) -> None:
    for name, value in before["sysctls"].items():
        path = Path("/proc/sys", name)
        if path.read_text().strip() != value:
            path.write_text(value)


def undo_mounts(before: dict[str, Any], roots: Sequence[Path]) -> None:
    # Deepest first: a volume mount inside a container's rootfs goes before the rootfs.
    for point in sorted(set(mounts(roots)) - set(before["mounts"]), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)


def undo_dirs(before: dict[str, Any]) -> None:
    for top, old in before["dirs"].items():
        root = Path(top)
        if not root.is_dir():
            continue
        if old is None:
            shutil.rmtree(root, ignore_errors=True)
            continue
        for rel in sorted(set(watched_dirs()[top] or []) - set(old), key=len, reverse=True):
            path = root / rel
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


def undo_cgroups(before: dict[str, Any]) -> None:
    """rmdir the kubepods cgroups created since `before`, leaves first (all their tasks are gone
    by now; a cgroup with a live task refuses and stays in the differences)."""
    for top in set(kubepods_cgroups()) - set(before["cgroups"]):
        for dirpath, _, _ in sorted(os.walk(top), key=lambda entry: len(entry[0]), reverse=True):
            with contextlib.suppress(OSError):
                os.rmdir(dirpath)


def undo_links(before: dict[str, Any], bridge: str) -> None:
    """Delete the node's bridge and the pods' veths if new (another link is not ours to delete)."""
    for name in set(links()) - set(before["links"]):
        if name == bridge or name.startswith("veth"):
            subprocess.run(["ip", "link", "delete", name], check=False, capture_output=True)


def undo(before: dict[str, Any], roots: Sequence[Path], *, bridge: str) -> None:
    """Everything new since `before`, undone: mounts, links, iptables chains, sysctls, watched
    directories' new files and kubepods cgroups."""
    undo_mounts(before, roots)
    undo_links(before, bridge)
    undo_iptables(before)
    undo_sysctls(before)
    undo_dirs(before)
    undo_cgroups(before)
