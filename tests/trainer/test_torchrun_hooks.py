"""kubetrain.runtime.torchrun_hooks, loaded the way a pod and `run --local` load it: before
the script, without the script knowing."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kubetrain.local.localize import SITE_DIR

pytestmark = pytest.mark.unit

PROBE = textwrap.dedent(
    """
    import sys
    assert "torch" not in sys.modules, "the hooks import nothing of torch at start-up"
    import torch.distributed as dist
    from torch.distributed import init_process_group
    print("wrapped", getattr(init_process_group, "_kubetrain_hooked", False))
    print("nn before init", "torch.distributed.nn" in sys.modules)
    import torch.distributed.elastic.agent.server.api as api
    print("agent", api.SimpleElasticAgent._exit_barrier.__qualname__.split(".")[0])
    """
)


def run_probe(extra_env: dict[str, str]) -> list[str]:
    env = {**os.environ, **extra_env}
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_the_local_runners_sitecustomize_installs_both_hooks() -> None:
    assert run_probe({"PYTHONPATH": str(SITE_DIR)}) == [
        "wrapped True",
        "nn before init False",
        "agent _node0_enters_exit_barrier_last",
    ]


def test_without_the_hooks_torch_is_untouched() -> None:
    assert run_probe({"PYTHONPATH": ""}) == ["wrapped False", "nn before init False", "agent SimpleElasticAgent"]


def test_a_scripts_own_init_leaves_the_default_group_unpinned() -> None:
    """torch.distributed.nn binds `group.WORLD` into its functions' defaults when first imported;
    imported after the default group exists (DDP does it), those defaults pin the group so a
    script's destroy_process_group cannot free it. With the hooks, a plain script's own
    init_process_group imports it first: the defaults stay None."""
    script = textwrap.dedent(
        """
        import inspect
        import torch.distributed as dist
        from kubetrain.api.contract import free_port
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
        import torch.distributed.nn.functional as F
        print(inspect.signature(F.all_reduce).parameters["group"].default)
        dist.destroy_process_group()
        """
    )
    outputs = []
    for pythonpath in (str(SITE_DIR), ""):
        env = {**os.environ, "PYTHONPATH": pythonpath}
        done = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120, check=False
        )
        assert done.returncode == 0, done.stderr
        # The last line: gloo of torch 2.8 prints "[Gloo] Rank 0 is connected to 0 peer ranks" first.
        outputs.append(done.stdout.strip().splitlines()[-1])
    assert outputs[0] == "None", "with the hooks nothing pins the group"
    assert outputs[1] != "None", "without them the import after init pins it (the bug the hook closes)"


def test_torchrun_ends_without_finalizing_once_its_workers_failed(tmp_path: Path) -> None:
    """Its error summary and exit code as before; no atexit hook (no interpreter finalization,
    which took torchrun 10-11 s on loaded cores) runs after it."""
    (tmp_path / "fail.py").write_text("import sys\nsys.exit(3)\n")
    site = tmp_path / "site"
    site.mkdir()
    # Loaded by every Python here before the hooks: an atexit hook that says it ran.
    (site / "sitecustomize.py").write_text(
        "import atexit, sys\n"
        "atexit.register(lambda: print('FINALIZED', file=sys.stderr))\n"
        f"exec(open({str(SITE_DIR / 'sitecustomize.py')!r}).read())\n"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    torchrun = [sys.executable, "-c", "import sys; from torch.distributed.run import main; sys.exit(main())"]
    done = subprocess.run(
        [*torchrun, "--nproc-per-node=1", str(tmp_path / "fail.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 1, done.stderr[-3000:]
    assert "ChildFailedError" in done.stderr and "exitcode  : 3" in done.stderr
    assert done.stderr.count("FINALIZED") == 1, "the worker's interpreter finalizes; torchrun's does not"
