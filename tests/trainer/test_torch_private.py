"""kubetrain.runtime.torch_private, the wall around every private torch name the runtime uses:
a canary per declared name and signature against the installed torch, what a torch without one
gets (torch's own behaviour, reported), and that no other product module spells one."""

from __future__ import annotations

import ast
import dataclasses
import datetime
import importlib
import inspect
import json
import os
import re
import signal
import types
from pathlib import Path
from typing import Any

import pytest

from kubetrain.api.contract import ATTEMPT_FILE_ENV
from kubetrain.runtime import torch_private
from kubetrain.runtime.agent import inplace
from kubetrain.runtime.torch_private import Private

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def assigned_by(owner: type, name: str) -> bool:
    """Whether `owner` or a class it inherits from sets `self.<name>` in its own source."""
    pattern = re.compile(rf"\bself\.{re.escape(name)}\s*(:[^=]*)?=[^=]")
    for cls in owner.__mro__:
        if cls is object:
            continue
        try:
            source = inspect.getsource(cls)
        except (OSError, TypeError):
            continue
        if pattern.search(source):
            return True
    return False


def assert_present(name: Private) -> None:
    """The canary: `name` is in the installed torch, as the wall declares it."""
    if name.kind == "attribute":
        owner = getattr(importlib.import_module(name.module), str(name.owner), None)
        assert owner is not None, f"{name.module} has no class {name.owner}"
        assert assigned_by(owner, name.name), f"{name.owner} no longer sets self.{name.name}"
        return
    assert not torch_private.lacks(name), f"this torch has no {name} in {name.module}"
    if name.kind == "method" and name.wrapped:
        method = getattr(getattr(importlib.import_module(name.module), str(name.owner)), name.name)
        assert list(inspect.signature(method).parameters) == ["self", *name.params], name


# What the canaries find missing in the other torch CI runs the runtime's tests on (tests/run.sh,
# the lowest the README claims): known, reported as a fallback, and still checked, so that a
# torch that brings the name back, or loses another, fails here.
KNOWN_MISSING = {
    # 2.8's _shutdown takes only death_sig: killing a broken gang at once falls back to torch's stop.
    "2.8": {"LocalElasticAgent._shutdown(death_sig, timeout)"},
}


def torch_minor() -> str:
    import torch

    return ".".join(torch.__version__.split(".")[:2])


@pytest.mark.parametrize("name", torch_private.NAMES, ids=str)
def test_canary_every_private_name_and_signature_is_in_this_torch(name: Private) -> None:
    if str(name) in KNOWN_MISSING.get(torch_minor(), set()):
        with pytest.raises(AssertionError):
            assert_present(name)
        return
    assert_present(name)


def test_every_patched_or_called_name_is_declared_once() -> None:
    declared = [(n.module, n.owner, n.name) for n in torch_private.NAMES]
    assert len(declared) == len(set(declared))
    assert torch_private.exit_barrier_key() == "torchelastic/agent/terminal_state/num_members"


@pytest.fixture
def reported(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Any:
    """The `fallback` records this test prints (each feature is reported once per process)."""
    monkeypatch.setattr(torch_private, "_reported", set())

    def records() -> list[dict[str, Any]]:
        lines = capsys.readouterr().out.splitlines()
        return [json.loads(line) for line in lines if line.startswith('{"event":"fallback"')]

    return records


def test_a_torch_without_a_guarded_method_keeps_torchruns_restart(
    monkeypatch: pytest.MonkeyPatch, reported: Any
) -> None:
    """The canary fails the moment the name is gone; the in-place restart is then not patched
    in (neither half of it), and the fallback is reported."""
    import torch.distributed.elastic.agent.server.api as api
    import torch.distributed.elastic.agent.server.local_elastic_agent as module

    monkeypatch.delattr(module.LocalElasticAgent, "_monitor_workers")
    monkeypatch.delattr(api.SimpleElasticAgent, "_monitor_workers")
    with pytest.raises(AssertionError, match="_monitor_workers"):
        assert_present(torch_private.MONITOR_WORKERS)
    start = module.LocalElasticAgent._start_workers
    inplace.patch_agent(module)
    assert module.LocalElasticAgent._start_workers is start, "torch's own, unwrapped"
    # (A torch whose other features fall back too, 2.8's kill-at-once, reports those apart.)
    (record,) = [r for r in reported() if r["feature"] == "in-place-restart"]
    assert record["feature"] == "in-place-restart" and record["torch"].startswith("2.")
    assert record["missing"] == ["LocalElasticAgent._monitor_workers(worker_group)"]
    assert (
        "instead of in-place gang restarts, torchrun's own restart: a failure recreates the gang" in (record["message"])
    )


def test_a_fallback_record_reaches_the_jobs_status_and_events(
    reported: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The wall's record is the operator's: parsed as a record, folded into status.runtimeFallbacks
    (once per feature), one RuntimeFallback Warning Event."""
    from kubetrain.api.models import TrainingJobStatus
    from kubetrain.api.records import parse_record
    from kubetrain.operator import progress

    torch_private.fallback(torch_private.WARM_START, [torch_private.POPEN])
    torch_private.fallback(torch_private.WARM_START, [torch_private.POPEN])
    text = capsys.readouterr().out
    assert [parse_record(line) is not None for line in text.splitlines()] == [True], "reported once"
    status = progress.fold(TrainingJobStatus(), "a log line\n" + text)
    (kept,) = status.runtime_fallbacks or []
    assert kept.feature == "warm-start" and kept.torch == torch_private.torch_version()
    assert kept.message.endswith(
        "has no SubprocessHandler._popen(args, env): instead of workers started as forks of the agent, "
        "workers start cold, as new processes"
    )
    (event,) = progress.fallback_events(TrainingJobStatus(), status)
    assert (event.type, event.reason, event.message) == ("Warning", "RuntimeFallback", kept.message)
    assert progress.fold(status, text) == status and progress.fallback_events(status, status) == []


def test_a_shutdown_whose_second_parameter_changed_meaning_is_never_called(
    monkeypatch: pytest.MonkeyPatch, reported: Any
) -> None:
    """torch versions whose `_shutdown(death_sig, is_restart)` would have taken the positional
    timeout as `is_restart`: the wall calls torch's own stop instead, by keyword."""
    import torch.distributed.elastic.agent.server.local_elastic_agent as module

    calls: list[tuple[Any, ...]] = []

    class Agent:
        def _shutdown(self, death_sig: signal.Signals = signal.SIGTERM, timeout: int = 30) -> None:
            calls.append(("shutdown", death_sig, timeout))

        def _stop_workers(self, worker_group: str) -> None:
            calls.append(("stop", worker_group))

    def current(self: Any, death_sig: signal.Signals = signal.SIGTERM, timeout: int = 30) -> None:
        raise AssertionError("only its signature is read")

    # The signature of torch 2.15 (torch 2.8's is `_shutdown(death_sig)`: a canary's failure).
    monkeypatch.setattr(module.LocalElasticAgent, "_shutdown", current)
    torch_private.stop_workers(Agent(), "group", death_sig=signal.SIGKILL, timeout=10)
    assert calls == [("shutdown", signal.SIGKILL, 10)] and reported() == []

    def _shutdown(self: Any, death_sig: signal.Signals = signal.SIGTERM, is_restart: bool = False) -> None:
        calls.append(("shutdown", death_sig, is_restart))

    monkeypatch.setattr(module.LocalElasticAgent, "_shutdown", _shutdown)
    with pytest.raises(AssertionError, match="_shutdown"):
        assert_present(torch_private.SHUTDOWN)
    calls.clear()
    torch_private.stop_workers(Agent(), "group", death_sig=signal.SIGKILL, timeout=10)
    assert calls == [("stop", "group")]
    (record,) = reported()
    assert record["feature"] == "kill-at-once" and record["missing"] == [
        "LocalElasticAgent._shutdown(death_sig, timeout)"
    ]


def test_a_wrapped_method_with_another_parameter_is_not_patched(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed.elastic.multiprocessing.subprocess_handler.subprocess_handler as module

    def _popen(self: Any, args: tuple[str, ...], env: dict[str, str], numa: Any = None) -> Any:
        raise AssertionError("never called here")

    monkeypatch.setattr(module.SubprocessHandler, "_popen", _popen)
    monkeypatch.setattr(torch_private, "_reported", set())
    assert torch_private.lacks(torch_private.POPEN)
    inplace.patch_handler(module)
    assert module.SubprocessHandler._popen is _popen


def test_an_instance_without_a_guarded_attribute_gets_torchs_own_call(reported: Any) -> None:
    """Instance attributes are read when needed: absent, the exit barrier is torch's own, a
    handler's output counts as redirected (its worker starts cold), a rendezvous as connected."""
    agent_without_store = types.SimpleNamespace(_worker_group=None, _exit_barrier_timeout=300.0)
    with pytest.raises(torch_private.Missing):
        torch_private.exit_barrier_of(agent_without_store)
    assert torch_private.output_redirected(types.SimpleNamespace())
    assert not torch_private.output_redirected(types.SimpleNamespace(_stdout=None, _stderr=None))
    assert torch_private.rendezvous_connected(types.SimpleNamespace())
    assert [r["feature"] for r in reported()] == ["exit-barrier", "warm-start", "wait-for-node0"]


def test_a_static_rendezvous_without_its_names_connects_as_torch_does(
    monkeypatch: pytest.MonkeyPatch, reported: Any, tmp_path: Path
) -> None:
    """No next_rendezvous to wrap: torch's rendezvous is left as it is, and the wait for node 0 says
    so (an in-place job's elastic resize too: it rides on the same wrapper). A rendezvous without
    node 0's address connects at once, as torch's own client does."""
    import torch.distributed.elastic.rendezvous.static_tcp_rendezvous as real

    class StaticTCPRendezvous:
        pass

    module = types.ModuleType(real.__name__)
    module.StaticTCPRendezvous = StaticTCPRendezvous  # type: ignore[attr-defined]
    monkeypatch.setenv(ATTEMPT_FILE_ENV, str(tmp_path / "attempt"))
    inplace.patch_static_rendezvous(module)
    assert not hasattr(StaticTCPRendezvous, "next_rendezvous")
    assert [(r["feature"], r["missing"]) for r in reported()] == [
        ("wait-for-node0", ["StaticTCPRendezvous.next_rendezvous()"]),
        ("resize-in-place", ["StaticTCPRendezvous.next_rendezvous()"]),
    ]

    torch_private._reported.clear()
    node1 = types.SimpleNamespace(_store=None, rank=1, timeout=datetime.timedelta(seconds=5))
    assert torch_private.node0_to_wait_for(node1) is None
    (record,) = reported()
    assert (record["feature"], record["missing"]) == ("wait-for-node0", ["StaticTCPRendezvous.master_addr"])
    node1.master_addr, node1.master_port = "node-0", "29500"
    assert torch_private.node0_to_wait_for(node1) == ("node-0", 29500, 5.0)
    assert torch_private.node0_to_wait_for(types.SimpleNamespace(**{**vars(node1), "rank": 0})) is None, "it hosts"
    assert torch_private.node0_to_wait_for(types.SimpleNamespace(**{**vars(node1), "_store": object()})) is None


def test_the_launch_config_asks_nvml_only_where_torch_has_the_hook_to_wrap(
    monkeypatch: pytest.MonkeyPatch, reported: Any
) -> None:
    """torchrun's LaunchConfig asks about GPUs in its __post_init__: wrapped, it asks NVML
    (NVML_CHECK_ENV set for that call only); a torch without that hook is left as it is, and
    says so."""
    import torch.distributed.launcher.api as launcher

    seen: list[str | None] = []

    @dataclasses.dataclass
    class LaunchConfig:
        min_nodes: int = 1

        def __post_init__(self) -> None:
            seen.append(os.environ.get(inplace.NVML_CHECK_ENV))

    @dataclasses.dataclass
    class OldLaunchConfig:
        min_nodes: int = 1

    monkeypatch.delenv(inplace.NVML_CHECK_ENV, raising=False)
    module = types.ModuleType(launcher.__name__)
    module.LaunchConfig = LaunchConfig  # type: ignore[attr-defined]
    inplace.patch_launch_config(module)
    LaunchConfig()
    assert seen == ["1"] and inplace.NVML_CHECK_ENV not in os.environ
    assert reported() == []

    old = types.ModuleType(launcher.__name__)
    old.LaunchConfig = OldLaunchConfig  # type: ignore[attr-defined]
    inplace.patch_launch_config(old)
    assert "__post_init__" not in vars(OldLaunchConfig)
    (record,) = reported()
    assert (record["feature"], record["missing"]) == ("nvml-gpu-check", ["LaunchConfig.__post_init__()"])
    assert record["message"].endswith("workers forked from the agent start cold where there are GPUs")


def test_a_bug_in_the_agents_start_or_monitor_leaves_torchs_own_and_says_so(
    monkeypatch: pytest.MonkeyPatch, reported: Any
) -> None:
    """Where the in-place restart's part of torch's start or monitor raises (a bug, whatever the
    torch), the workers start as torch starts them and torch's verdict stands: logged, and said
    in a `fallback` record. A stop signal still reaches torchrun."""
    import torch.distributed.elastic.agent.server.local_elastic_agent as real
    from torch.distributed.elastic.multiprocessing.api import SignalException

    calls: list[str] = []

    class LocalElasticAgent:  # torch's names and parameters, as the wall declares them
        def _start_workers(self, worker_group: Any) -> Any:
            calls.append("torch starts")
            return {0: 4242}

        def _monitor_workers(self, worker_group: Any) -> Any:
            return "torch's verdict"

        def _initialize_workers(self, worker_group: Any) -> None:
            raise AssertionError("not called here")

        def _stop_workers(self, worker_group: Any) -> None:
            raise AssertionError("not called here")

        def _shutdown(self, death_sig: Any = None, timeout: Any = None) -> None:
            raise AssertionError("not called here")

    class Broken:
        error: Exception = RuntimeError("boom")

        def before_start(self, agent: Any, group: Any) -> None:
            raise self.error

        def after_start(self, group: Any, started: Any) -> None:
            calls.append(f"after {started}")

        def monitor(self, *args: Any) -> Any:
            raise self.error

    module = types.ModuleType(real.__name__)
    module.LocalElasticAgent = LocalElasticAgent  # type: ignore[attr-defined]
    module.WorkerState = real.WorkerState  # type: ignore[attr-defined]
    broken = Broken()
    monkeypatch.setattr(inplace, "_state", lambda agent: broken)
    inplace.patch_agent(module)
    agent = LocalElasticAgent()

    assert agent._start_workers("group") == {0: 4242}
    assert calls == ["torch starts", "after {0: 4242}"], "torch's start, then the agent port and the launch record"
    (record,) = reported()
    assert (record["feature"], record["missing"]) == ("in-place-restart", [])
    torch_version = record["torch"]
    assert record["message"].endswith(
        f"failed under torch {torch_version} (RuntimeError: boom): the workers start as torch alone starts them"
    )

    torch_private._reported.clear()
    assert agent._monitor_workers("group") == "torch's verdict"
    (record,) = reported()
    assert record["message"].endswith("(RuntimeError: boom): torchrun's own restart: a failure recreates the gang")

    broken.error = SignalException("Process 1 got signal: 15", sigval=signal.SIGTERM)
    calls.clear()
    with pytest.raises(SignalException):
        agent._start_workers("group")
    with pytest.raises(SignalException):
        agent._monitor_workers("group")
    assert calls == [], "a stop is torchrun's: nothing started"


def test_a_torch_that_ignores_pet_shutdown_timeout_says_the_budget_is_torchs_30_s(
    monkeypatch: pytest.MonkeyPatch, reported: Any
) -> None:
    """torch < 2.10: LaunchConfig has no shutdown_timeout, so PET_SHUTDOWN_TIMEOUT (the pod's
    grace period, rendered by the operator) does not reach the agent."""
    import torch.distributed.launcher.api as launcher

    @dataclasses.dataclass
    class LaunchConfig:
        min_nodes: int = 1

    @dataclasses.dataclass
    class NewLaunchConfig:  # torch >= 2.10's
        min_nodes: int = 1
        shutdown_timeout: int = 30

    old = types.ModuleType(launcher.__name__)
    old.LaunchConfig = LaunchConfig  # type: ignore[attr-defined]
    new = types.ModuleType(launcher.__name__)
    new.LaunchConfig = NewLaunchConfig  # type: ignore[attr-defined]
    monkeypatch.setenv("PET_SHUTDOWN_TIMEOUT", "120")
    assert torch_private.shutdown_timeout_read(new)
    assert reported() == []
    assert not torch_private.shutdown_timeout_read(old)
    (record,) = reported()
    assert record["feature"] == "shutdown-timeout" and record["missing"] == ["LaunchConfig.shutdown_timeout"]
    assert "torch's fixed 30 s from SIGTERM to SIGKILL" in record["message"]


# --- no other product module spells a private torch name ----------------------------------

STDLIB_PRIVATE = {("os", "_exit"), ("atexit", "_clear"), ("atexit", "_run_exitfuncs")}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and not name.startswith("_kubetrain")


def private_names_spelled(source: str) -> list[tuple[int, str]]:
    """(line, name) of every private name `source` reaches that it does not define itself: an
    attribute or a getattr-family string that none of its own classes set or define, a private
    name imported from torch, a `torch..._x` module string."""
    tree = ast.parse(source)
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    own.add(item.name)
                for target in item.targets if isinstance(item, ast.Assign) else []:
                    if isinstance(target, ast.Name):
                        own.add(target.id)
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
        ):
            own.add(node.attr)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            base = node.value.id if isinstance(node.value, ast.Name) else None
            if isinstance(node.ctx, ast.Store):  # only its own instances' attributes are set
                allowed = base in ("self", "cls")
            else:
                allowed = node.attr in own or (base, node.attr) in STDLIB_PRIVATE
            if not allowed:
                found.append((node.lineno, node.attr))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)
            and node.args[1].value not in own
        ):
            found.append((node.lineno, node.args[1].value))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names if _private(a.name)]
            if any(_private(part) for part in (node.module or "").split(".")):
                found.append((node.lineno, str(node.module)))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if any(map(_private, a.name.split(".")[1:]))]
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and re.fullmatch(r"torch(\.\w+)*\._\w+(\.\w+)*", node.value)
        ):
            found.append((node.lineno, node.value))
    return found


def test_only_the_wall_spells_a_private_torch_name() -> None:
    """The runtime (every room of it) and the built-in trainer."""
    spelled = {
        str(path.relative_to(ROOT)): names
        for path in sorted([*(ROOT / "runtime").rglob("*.py"), *(ROOT / "trainer").glob("*.py")])
        if path.name != "torch_private.py" and (names := private_names_spelled(path.read_text()))
    }
    assert spelled == {}


@pytest.mark.parametrize(
    "source",
    [
        "def f(agent):\n    agent._shutdown(death_sig=9, timeout=10)\n",
        "def f(cls):\n    cls_ = getattr(cls, '_start_workers', None)\n",
        "def f(module):\n    module.LocalElasticAgent._start_workers = None\n",
        "from torch.distributed.elastic.utils.store import _NUM_MEMBERS\n",
        "PRELOAD = ('torch._dynamo',)\n",
        "import torch._dynamo\n",
        "def wrapper(self):\n    return self._worker_group\n",
    ],
)
def test_the_scan_finds_a_private_name_spelled(source: str) -> None:
    assert private_names_spelled(source) != []


def test_the_scan_leaves_a_modules_own_private_names_alone() -> None:
    source = "import os\nclass A:\n    def __init__(self):\n        self._store = 1\n    def f(self, other):\n"
    source += "        return self._store + other._store + self._g()\n    def _g(self):\n        os._exit(0)\n"
    assert private_names_spelled(source) == []


@pytest.mark.unit
def test_the_status_field_names_every_feature_the_wall_reports() -> None:
    """status.runtimeFallbacks[].feature is what a user reads: its description (the CRD's) lists
    each feature a fallback record may name."""
    from kubetrain.api.models import RuntimeFallback

    description = RuntimeFallback.model_fields["feature"].description or ""
    named = set(re.findall(r"[a-z0-9]+(?:-[a-z0-9]+)+|preload", description))
    assert {feature.key for feature in torch_private.FEATURES} | {"shutdown-timeout"} <= named
