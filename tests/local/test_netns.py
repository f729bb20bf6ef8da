"""--netns: every node in its own network namespace; MASTER_ADDR is node 0's name, not loopback."""

from __future__ import annotations

import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
from support.jobs import digits_job, fake_job, write_job
from support.local_runs import is_root, records, start_run, summary

pytestmark = [
    pytest.mark.train,
    pytest.mark.skipif(not is_root() or shutil.which("ip") is None, reason="--netns needs root and iproute2's `ip`"),
]

# Node 0 accepts one connection on MASTER_ADDR:MASTER_PORT; node 1 connects and both report
# the addresses they saw.
SCRIPT = textwrap.dedent(
    """
    import os, socket, sys, time
    rank, port = os.environ['NODE_RANK'], int(os.environ['MASTER_PORT'])
    master = socket.gethostbyname(os.environ['MASTER_ADDR'])
    if rank == '0':
        server = socket.create_server(('0.0.0.0', port))
        conn, (peer, _) = server.accept()
        print('master', os.environ['MASTER_ADDR'], master, 'peer', peer)
    else:
        for _ in range(200):
            try:
                socket.create_connection((master, port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        else:
            sys.exit(1)
    """
)


def namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout


def test_nodes_get_their_own_addresses(tmp_path: Path) -> None:
    before = namespaces()
    proc = start_run(write_job(tmp_path, fake_job(SCRIPT, runPolicy={"maxRestarts": 0})), tmp_path / "run", "--netns")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    line = next(line for line in out.splitlines() if line.startswith("[node-0] master"))
    _, _, name, master, _, peer = line.split()
    assert name == "fake-node-0.fake.default.svc.cluster.local"
    assert not master.startswith("127.") and not peer.startswith("127.") and master != peer
    assert namespaces() == before, "namespaces left behind"


def test_training_across_namespaces(tmp_path: Path) -> None:
    proc = start_run(write_job(tmp_path, digits_job(maxSteps=30)), tmp_path / "run", "--netns")
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-4000:]
    assert summary(tmp_path / "run")["nodeExitCodes"] == [0, 0]
    assert records(tmp_path / "run")[-1]["event"] == "done"
