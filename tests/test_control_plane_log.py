"""What makes a test control plane unclean (support.controlplane.ControlPlane.trouble): a
component that exited on its own, a Go panic (a recovered one included) or a klog fatal line.
That `running()` then fails its block, on a real control plane: test_harness_control_plane.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support.controlplane import ControlPlane

pytestmark = pytest.mark.unit

LOGS = {
    "kube-apiserver.log": [
        "I1125 14:00:00.000000       1 server.go:100] Serving securely on 127.0.0.1:6443",
        'E1125 14:00:01.000000       1 wrap.go:57] "Observed a panic" panic="killing connection"',
        "W1125 14:00:02.000000       1 lease.go:200] a warning is not trouble",
    ],
    "etcd.log": ['{"level":"warn","msg":"apply request took too long"}'],
    "kube-controller-manager.log": [
        "F1125 14:00:03.000000       1 controllermanager.go:300] error starting controllers",
        "panic: runtime error: invalid memory address or nil pointer dereference",
    ],
}


def test_trouble_names_the_exited_components_and_the_panics(tmp_path: Path) -> None:
    cp = ControlPlane(workdir=tmp_path, bin_dir=tmp_path, server="https://127.0.0.1:1", kubeconfig=tmp_path / "k")
    cp.logs.mkdir()
    for name, lines in LOGS.items():
        (cp.logs / name).write_text("\n".join(lines) + "\n")
    cp.processes["etcd"] = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    cp.processes["etcd"].wait()
    cp.processes["kube-apiserver"] = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        found = cp.trouble()
    finally:
        cp.stop()
    assert found == [
        "etcd exited with 3",
        "kube-apiserver.log: " + LOGS["kube-apiserver.log"][1],
        *("kube-controller-manager.log: " + line for line in LOGS["kube-controller-manager.log"]),
    ]
