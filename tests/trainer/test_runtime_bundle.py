"""kubetrain.runtime.bundle: the runtime an init container copies into images without
kubetrain. It must be the whole import closure of the runtime package, need nothing but the standard
library and torch, parse and import on every Python a user's image may carry (3.10 to 3.13), and
load through its sitecustomize in a Python that has torch and no kubetrain (nor pydantic)."""

from __future__ import annotations

import ast
import glob
import json
import os
import pkgutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest
from support.shipped import kubeflow_ddp

from kubetrain.api.function import RUNNER_MODULE
from kubetrain.client.ship import ship
from kubetrain.client.spec import function_files
from kubetrain.runtime import bundle as runtime_bundle

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"api": ROOT / "api", "runtime": ROOT / "runtime", "trainer": ROOT / "trainer"}
# What the runtime may import besides the standard library and itself: the user's torch. The
# adapters reach transformers and lightning only through sys.modules, never by import.
ALLOWED_THIRD_PARTY = {"torch"}
PYTHONS = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[0-3].*/bin/python3")))


def _file(module: str) -> Path | None:
    parts = module.split(".")
    if parts[0] != "kubetrain" or len(parts) < 2 or parts[1] not in FOLDERS:
        return None
    base = FOLDERS[parts[1]].joinpath(*parts[2:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def closure(root: str) -> tuple[set[str], set[str]]:
    """kubetrain modules `root` imports, at any depth and in function bodies too (with their
    packages), and the third-party top-level names among everything they import."""
    seen: set[str] = set()
    third: set[str] = set()
    todo = [root]
    while todo:
        module = todo.pop()
        path = _file(module)
        if module in seen or path is None:
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(2, len(parts))]
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            for name in names:
                if name.startswith("kubetrain."):
                    todo.append(name)
                elif name.split(".")[0] not in sys.stdlib_module_names:
                    third.add(name.split(".")[0])
    return seen, third


@pytest.mark.unit
def test_the_bundle_is_the_runtimes_whole_import_closure_of_standard_library_and_torch() -> None:
    """Computed here independently of the bundle's own walk: from the package's modules, as
    pkgutil lists them (the hooks and the runner of shipped functions among them)."""
    roots = [info.name for info in pkgutil.walk_packages([str(ROOT / "runtime")], "kubetrain.runtime.")]
    assert {"kubetrain.runtime.torchrun_hooks", RUNNER_MODULE} <= set(roots)
    modules: set[str] = set()
    third_party: set[str] = set()
    for root in ["kubetrain.runtime", *roots]:
        found, third = closure(root)
        modules |= found
        third_party |= third
    assert modules == {runtime_bundle.module_name(path) for path in runtime_bundle.files()}
    assert not any(m.startswith("kubetrain.trainer") for m in modules)
    assert third_party <= ALLOWED_THIRD_PARTY, third_party - ALLOWED_THIRD_PARTY


@pytest.mark.unit
def test_the_bundle_needs_no_python_newer_than_3_10() -> None:
    """vermin reads the syntax and the standard library names each file uses (a static check; the
    test below runs the interpreters this machine has)."""
    files = [str(runtime_bundle.LOADER)] + [str(path) for path in runtime_bundle.files()]
    done = subprocess.run(
        [str(Path(sys.executable).parent / "vermin"), "--no-tips", "--violations", "-t=3.10-", *files],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def install(tmp_path: Path) -> Path:
    into = tmp_path / "kubetrain-runtime"
    written = runtime_bundle.install(into)
    assert len(written) == len(runtime_bundle.files()) + 1
    return into


@pytest.mark.unit
def test_install_writes_files_any_user_reads(tmp_path: Path) -> None:
    into = install(tmp_path)
    assert (into / "site" / "sitecustomize.py").read_bytes() == runtime_bundle.LOADER.read_bytes()
    hooks = into / "lib" / "kubetrain" / "runtime" / "torchrun_hooks.py"
    assert hooks.read_bytes() == (ROOT / "runtime" / "torchrun_hooks.py").read_bytes()
    assert all(p.stat().st_mode & 0o004 for p in into.rglob("*")), "readable by the trainer's user"
    assert not (into / "lib" / "kubetrain" / "__init__.py").exists(), "kubetrain stays a namespace package"


@pytest.mark.unit
def test_install_leaves_the_volume_root_alone(tmp_path: Path) -> None:
    """The init container's user may not own the emptyDir's root (0777, root's): no chmod of it."""
    into = tmp_path / "volume"
    into.mkdir(mode=0o777)
    into.chmod(0o777)
    runtime_bundle.install(into)
    assert into.stat().st_mode & 0o777 == 0o777


@pytest.mark.unit
def test_main_says_what_it_wrote(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kubetrain.runtime.bundle", str(tmp_path / "rt")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert f"{len(runtime_bundle.files()) + 1} files in {tmp_path / 'rt'}" in done.stderr


# What a pod's Python reports with the bundle first on its PYTHONPATH: where the hooks came from,
# and whether pydantic or yaml were imported.
PROBE = textwrap.dedent(
    """
    import json, sys
    hooks = sys.modules.get("kubetrain.runtime.torchrun_hooks")
    import kubetrain.runtime.guest.guest_records, kubetrain.runtime.guest.hf_adapter
    import kubetrain.runtime.guest.lightning_adapter
    import kubetrain.runtime.guest.step_watch, kubetrain.runtime.worker.watchdog, kubetrain.runtime.worker.metrics
    print(json.dumps({
        "hooks": hooks.__file__ if hooks else None,
        "heavy": sorted(
            m for m in sys.modules if m.split(".")[0] in ("pydantic", "yaml", "torch") or m == "kubetrain.api.models"
        ),
    }))
    """
)


@pytest.mark.unit
@pytest.mark.parametrize("python", PYTHONS or [None], ids=lambda p: Path(p).parents[1].name if p else "none")
def test_the_bundle_loads_on_every_python_a_user_image_may_carry(tmp_path: Path, python: str | None) -> None:
    """In a bare interpreter (no kubetrain, no torch, no pydantic): every file compiles, and the
    loader puts the bundled hooks in place before user code without importing anything heavy."""
    if python is None:
        pytest.skip("no other CPython 3.10-3.13 under ~/.pyenv/versions to run the bundle on")
    into = install(tmp_path)
    subprocess.run([python, "-m", "compileall", "-q", str(into)], check=True, timeout=120)
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(into / "site"), "HOME": str(tmp_path)}
    done = subprocess.run(
        [python, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120, check=True, cwd=tmp_path
    )
    found = json.loads(done.stdout)
    assert found == {"hooks": str(into / "lib" / "kubetrain" / "runtime" / "torchrun_hooks.py"), "heavy": []}
    assert "kubetrain" not in done.stderr, done.stderr


def guest_python(tmp_path: Path) -> Path:
    """A Python like a user's image: this interpreter, torch and the frameworks (this venv's
    site-packages as a plain path entry, so its kubetrain .pth is never processed), and no
    kubetrain or pydantic (an import of either fails)."""
    venv = tmp_path / "guest"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = Path(
        subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout.strip()
    )
    (site / "_no_kubetrain.py").write_text(
        textwrap.dedent(
            """
            import importlib.abc, sys
            class _Missing(importlib.abc.MetaPathFinder):
                def find_spec(self, name, path=None, target=None):
                    if name.split(".")[0] in ("pydantic", "pydantic_core"):
                        raise ModuleNotFoundError(f"No module named {name!r} (not in this image)")
                    return None
            sys.meta_path.insert(0, _Missing())
            """
        )
    )
    (site / "00-no-kubetrain.pth").write_text("import _no_kubetrain\n")
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    python = venv / "bin" / "python"
    check = "import importlib.util as u; print(u.find_spec('kubetrain') is None, u.find_spec('torch') is not None)"
    shown = subprocess.run(
        [str(python), "-c", check], capture_output=True, text=True, timeout=60, check=True, cwd=tmp_path
    )
    assert shown.stdout.split() == ["True", "True"], "the guest has torch and no kubetrain"
    return python


@pytest.mark.unit
def test_in_a_python_without_kubetrain_the_bundle_loads_the_hooks_and_no_pydantic(tmp_path: Path) -> None:
    python = guest_python(tmp_path)
    into = install(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(into / "site")}
    done = subprocess.run([str(python), "-c", PROBE], capture_output=True, text=True, env=env, timeout=120, check=True)
    found = json.loads(done.stdout)
    assert found == {"hooks": str(into / "lib" / "kubetrain" / "runtime" / "torchrun_hooks.py"), "heavy": []}


@pytest.mark.unit
def test_an_image_with_its_own_kubetrain_keeps_it(tmp_path: Path) -> None:
    """The trainer image (or any with kubetrain installed): the bundle's loader changes nothing."""
    into = install(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(into / "site")}
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120, check=True
    )
    hooks = json.loads(done.stdout)["hooks"]
    assert hooks is not None and not hooks.startswith(str(into)), hooks


PLAIN_DDP = textwrap.dedent(
    """
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(6):
        opt.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()
    dist.destroy_process_group()
    """
)


@pytest.mark.train
def test_a_plain_ddp_script_under_torchrun_in_a_python_without_kubetrain_reports_its_steps(tmp_path: Path) -> None:
    """The bundle is the runtime for real: torchrun's agent and both workers load it, and step_watch
    prints rank 0's rendezvous and step records for a script that imports nothing of kubetrain."""
    python = guest_python(tmp_path)
    into = install(tmp_path)
    (tmp_path / "train.py").write_text(PLAIN_DDP)
    env = {**os.environ, "PYTHONPATH": str(into / "site"), "OMP_NUM_THREADS": "1"}
    command = [str(python), "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "train.py"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"event"')]
    events = [record["event"] for record in records]
    assert events[0] == "rendezvous" and records[0]["world_size"] == 2, records
    assert [r["step"] for r in records if r["event"] == "step"][-1] == 6, records


@pytest.mark.train
def test_a_kubeflow_style_function_runs_in_a_python_without_kubetrain(tmp_path: Path) -> None:
    """Client.train's runner is in the bundle: a function written as Kubeflow's SDK documents one,
    shipped as train() ships it, runs on 2 processes under torchrun in a Python that has torch and
    neither kubetrain nor pydantic."""
    python = guest_python(tmp_path)
    into = install(tmp_path)
    shipment = tmp_path / "function"
    shipment.mkdir()
    for name, text in function_files(ship(kubeflow_ddp, (1,))).items():
        (shipment / name).write_text(text)
    env = {**os.environ, "PYTHONPATH": str(into / "site"), "OMP_NUM_THREADS": "1"}
    command = [str(python), "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    command += ["-m", RUNNER_MODULE, str(shipment)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert done.stdout.count("Distributed Training with WORLD_SIZE: 2") == 2, done.stdout[-4000:]
    assert "Training is finished" in done.stdout  # rank 0's last words; both ranks exited 0
