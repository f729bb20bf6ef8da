"""Fast, single-process tests of the trainer's parts: env contract, data, checkpoints, metrics."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from support.trainer_runs import base_env, free_port

from kubetrain.api import contract
from kubetrain.api.training import TrainingSpec
from kubetrain.runtime.worker.dist import (
    ContractError,
    MasterUnreachableError,
    hold_agent_store,
    read_env,
    wait_for_master,
)
from kubetrain.runtime.worker.metrics import MetricsLogger
from kubetrain.trainer.checkpoint import (
    Checkpointer,
    CheckpointError,
    complete_checkpoints,
    latest_checkpoint,
    read_checkpoint,
)
from kubetrain.trainer.data import load_splits, sharded_loader
from kubetrain.trainer.model import build_model
from kubetrain.trainer.volume import prune, write_checkpoint

pytestmark = pytest.mark.unit

# --- env contract ---------------------------------------------------------------------------


def _pod(nnodes: int, node_rank: int, nproc: int) -> dict[str, str]:
    return contract.rendezvous_env(
        master_addr="job-0.job", master_port=29500, nnodes=nnodes, node_rank=node_rank, nproc_per_node=nproc
    )


def test_single_process_pod_needs_no_torchrun() -> None:
    env = read_env(_pod(3, 2, 1))
    assert (env.rank, env.world_size, env.local_rank, env.node_rank) == (2, 3, 0, 2)
    assert (env.master_addr, env.master_port) == ("job-0.job", 29500)


def test_torchrun_process_rank_is_not_the_node_rank() -> None:
    # What torchrun adds for the 2nd process of node 1 in a 2x4 job.
    pod = {**_pod(2, 1, 4), "RANK": "5", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "WORLD_SIZE": "8"}
    env = read_env(pod)
    assert (env.rank, env.world_size, env.local_rank, env.node_rank) == (5, 8, 1, 1)


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        (_pod(2, 1, 4), "run under torchrun"),
        ({"WORLD_SIZE": "2", "RANK": "2", "MASTER_ADDR": "a"}, "RANK=2 is outside WORLD_SIZE=2"),
        ({"WORLD_SIZE": "2", "RANK": "x", "MASTER_ADDR": "a"}, "RANK='x' is not an integer"),
        ({"WORLD_SIZE": "2", "RANK": "1"}, "MASTER_ADDR is not set"),
        ({"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "a", "MASTER_PORT": "70000"}, "not a TCP port"),
        ({"NPROC_PER_NODE": "2"}, "run the script under torchrun"),
    ],
)
def test_contract_errors_say_what_is_wrong(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ContractError, match=message):
        read_env(environ)


def test_no_contract_is_a_world_of_one() -> None:
    env = read_env({})
    assert (env.rank, env.world_size, env.master_addr) == (0, 1, "127.0.0.1")


def test_connect_retry_names_host_port_and_seconds() -> None:
    port = free_port()  # nothing listens there
    start = time.monotonic()
    with pytest.raises(MasterUnreachableError) as info:
        wait_for_master("127.0.0.1", port, 0.6, interval_s=0.1)
    assert 0.6 <= time.monotonic() - start < 5
    assert f"127.0.0.1:{port}" in str(info.value) and "within 0." in str(info.value)


def test_connect_retry_covers_a_master_name_that_does_not_resolve_yet() -> None:
    # A headless Service's record appears only once the master pod is ready.
    with pytest.raises(MasterUnreachableError, match=r"master job-0\.not-yet\.invalid:29500 did not accept"):
        wait_for_master("job-0.not-yet.invalid", 29500, 0.3, interval_s=0.1)


def test_connect_retry_returns_once_master_listens() -> None:
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert wait_for_master("127.0.0.1", server.getsockname()[1], 2) < 2


@pytest.mark.parametrize(
    ("environ", "others_arrived", "held_until_arrival"),
    [
        # Node 0 of 3 waits for the 2 other agents, counted under torchrun's run id.
        ({"GROUP_RANK": "0", "GROUP_WORLD_SIZE": "3", "TORCHELASTIC_RUN_ID": "job"}, 2, True),
        ({"GROUP_RANK": "0", "GROUP_WORLD_SIZE": "3", "TORCHELASTIC_RUN_ID": "job"}, 1, False),
        ({"GROUP_RANK": "0", "GROUP_WORLD_SIZE": "2"}, 1, True),  # torchrun's default run id "none"
        # Only node 0 hosts the store; a one-node job has no peer to wait for.
        ({"GROUP_RANK": "1", "GROUP_WORLD_SIZE": "3", "TORCHELASTIC_RUN_ID": "job"}, 0, None),
        ({"GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1"}, 0, None),
    ],
)
def test_node0_holds_its_agent_until_the_others_wait_in_the_exit_barrier(
    environ: dict[str, str], others_arrived: int, held_until_arrival: bool | None
) -> None:
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    store = TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    key = f"{environ.get('TORCHELASTIC_RUN_ID', 'none')}/torchelastic/agent/terminal_state/num_members"
    store.add(key, others_arrived)
    # Where the others arrived (or none are awaited) the call returns True long before a timeout
    # that no loaded machine reaches; where one is missing it returns False after a short one.
    timeout = 0.3 if held_until_arrival is False else 60.0
    start = time.monotonic()
    held = hold_agent_store(store, environ, timeout_s=timeout, interval_s=0.01)
    waited = time.monotonic() - start
    assert held is (held_until_arrival is not False)
    assert waited >= 0.3 if held_until_arrival is False else waited < 30


# --- data and models ------------------------------------------------------------------------


def test_mid_epoch_skip_continues_the_same_order() -> None:
    data = torch.utils.data.TensorDataset(torch.arange(100))
    loader = sharded_loader(data, batch_size=4, rank=1, world_size=2, seed=7)
    full = [batch for (batch,) in loader.epoch(3)]
    resumed = [batch for (batch,) in loader.epoch(3, skip_batches=5)]
    assert len(full) == 12 and len(resumed) == 7
    assert all(torch.equal(a, b) for a, b in zip(full[5:], resumed, strict=True))
    again = [batch for (batch,) in loader.epoch(3)]  # the skip applies to one iteration only
    assert all(torch.equal(a, b) for a, b in zip(full, again, strict=True))


@pytest.mark.parametrize(("model", "dataset"), [("mlp", "digits"), ("cnn", "digits"), ("cnn", "synthetic")])
def test_models_fit_their_inputs(model: str, dataset: str) -> None:
    spec = TrainingSpec(model=model, dataset=dataset, synthetic_samples=64, hidden_size=16)
    splits = load_splits(spec)
    net = build_model(spec, splits.input_shape, splits.num_classes)
    x, _ = splits.train[:5]
    assert net(x).shape == (5, 10)


def test_digits_split_is_the_bundled_dataset() -> None:
    splits = load_splits(TrainingSpec(dataset="digits", test_fraction=0.2))
    assert len(splits.train) + len(splits.test) == 1797
    assert splits.input_shape == (1, 8, 8)


# --- checkpoints ----------------------------------------------------------------------------


def _payload(value: float) -> dict[str, Any]:
    return {"state": {"w": torch.full((4,), value)}, "ranks": []}


def test_latest_complete_and_keep_last_k(tmp_path: Path) -> None:
    for step in (5, 10, 20):
        write_checkpoint(tmp_path, step, _payload(step), {"fingerprint": "f"})
    (tmp_path / "step-30").mkdir()  # no meta.json: incomplete
    (tmp_path / ".tmp-step-40-1").mkdir()
    assert latest_checkpoint(tmp_path) == tmp_path / "step-20"
    prune(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-10", "step-20"]
    payload, meta = read_checkpoint(tmp_path / "step-20")
    assert torch.equal(payload["state"]["w"], torch.full((4,), 20.0)) and meta["step"] == 20


_KILL_WRITER = textwrap.dedent(
    """
    import os, sys, torch
    from kubetrain.trainer import volume as checkpoint
    directory, point = sys.argv[1], sys.argv[2]
    checkpoint.write_checkpoint(directory, 1, {"state": {"w": torch.ones(3)}, "ranks": []}, {})
    def block(*args, **kwargs):
        print("blocked", flush=True)
        sys.stdin.read()  # until the test kills us
    if point == "state":
        checkpoint.os.fsync = block  # state.pt written, not yet synced or renamed
    else:
        checkpoint.json.dump = block  # step-2/ renamed into place, meta.json not written
    checkpoint.write_checkpoint(directory, 2, {"state": {"w": torch.zeros(1 << 20)}, "ranks": []}, {})
    """
)


@pytest.mark.parametrize("point", ["state", "meta"])
def test_kill_during_checkpoint_write_keeps_previous(point: str, tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILL_WRITER, str(tmp_path), point],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "blocked"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    leftover = {p.name for p in tmp_path.iterdir()}
    assert leftover == ({"step-1", "step-2"} if point == "meta" else {"step-1", f".tmp-step-2-{proc.pid}"})
    assert [step for step, _ in complete_checkpoints(tmp_path)] == [1]
    payload, _ = read_checkpoint(latest_checkpoint(tmp_path))  # type: ignore[arg-type]
    assert torch.equal(payload["state"]["w"], torch.ones(3))
    # The next save replaces the leftovers.
    write_checkpoint(tmp_path, 2, _payload(2), {})
    prune(tmp_path, keep=5)
    assert [step for step, _ in complete_checkpoints(tmp_path)] == [1, 2]
    assert {p.name for p in tmp_path.iterdir()} == {"step-1", "step-2"}


def test_single_rank_checkpointer_restores_rng_and_refuses_other_fingerprint(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(1)
    saver = Checkpointer(tmp_path, rank=0, world_size=1, fingerprint="aaa", generators=[gen])
    torch.manual_seed(5)
    saver.save(7, {"step": 7})
    expected = (torch.rand(3), torch.rand(2, generator=gen))
    torch.rand(10), torch.rand(10, generator=gen)
    path, state = saver.load()  # type: ignore[misc]
    assert path.name == "step-7" and state == {"step": 7}
    assert torch.equal(torch.rand(3), expected[0]) and torch.equal(torch.rand(2, generator=gen), expected[1])
    other = Checkpointer(tmp_path, rank=0, world_size=1, fingerprint="bbb")
    with pytest.raises(CheckpointError, match="different training configuration"):
        other.load()
    message = Checkpointer(tmp_path, rank=0, world_size=2, fingerprint="aaa")._check(
        path, json.loads((path / "meta.json").read_text())
    )
    assert message is not None and "written by 1 processes and this run has 2" in message


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("rank", "every_steps", "every_seconds", "elapsed_s", "step", "agreed_vote", "vote", "due"),
    [
        (0, 10, None, 0, 20, False, False, True),  # on the step cadence
        (0, 10, None, 0, 25, False, False, False),
        (0, None, 60, 59, 25, False, False, False),  # rank 0's clock: not yet
        (0, None, 60, 60, 25, False, True, False),  # rank 0 votes; only the agreed vote saves
        (0, None, 60, 60, 25, True, True, True),
        (1, None, 60, 600, 25, True, False, True),  # others never vote, but follow the agreed vote
        (0, None, None, 600, 25, False, False, False),  # no cadence: only the loop's own saves
    ],
)
def test_checkpointer_owns_when_a_save_is_due(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    rank: int,
    every_steps: int | None,
    every_seconds: int | None,
    elapsed_s: float,
    step: int,
    agreed_vote: bool,
    vote: bool,
    due: bool,
) -> None:
    clock = FakeClock()
    monkeypatch.setattr("kubetrain.trainer.checkpoint.time.monotonic", clock)
    ckpt = Checkpointer(tmp_path, rank=rank, world_size=1, every_steps=every_steps, every_seconds=every_seconds)
    clock.now += elapsed_s
    assert ckpt.time_vote() is vote
    assert ckpt.due(step, time_vote=agreed_vote) is due


def test_a_saved_or_resumed_step_is_not_due_again(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clock = FakeClock()
    monkeypatch.setattr("kubetrain.trainer.checkpoint.time.monotonic", clock)
    ckpt = Checkpointer(tmp_path, rank=0, world_size=1, every_steps=10, every_seconds=60)
    clock.now += 60
    ckpt.save(20, {"step": 20})
    assert ckpt.last_step == 20 and not ckpt.time_vote(), "a save restarts the clock"
    assert not ckpt.due(20, time_vote=True)
    resumed = Checkpointer(tmp_path, rank=0, world_size=1, every_steps=10)
    assert resumed.last_step is None
    resumed.load()
    assert resumed.last_step == 20 and not resumed.due(20)


def test_a_peer_lost_during_a_save_leaves_the_step_to_the_survivors_save(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Seen in the elastic benchmark: node 2 died while the gang gathered the epoch save's RNG
    states; the save had marked its step saved first, so no survivor saved it and the gang
    resumed 14 steps back."""
    from kubetrain.runtime.worker import survivor

    def lost(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("[pair.cc:561] Connection closed by peer [127.0.0.1]:33989")

    monkeypatch.setattr("kubetrain.trainer.checkpoint.dist.gather_object", lost)
    for name in ("MASTER_ADDR", "MASTER_PORT", survivor.ENABLED_ENV):  # no store: no election
        monkeypatch.delenv(name, raising=False)
    ckpt = Checkpointer(tmp_path, rank=1, world_size=2)
    with pytest.raises(RuntimeError) as failed:
        ckpt.save(84, {"step": 84}, reason="epoch")
    assert ckpt.last_step is None, "not saved: the gather failed"
    assert survivor.Survivor(rank=1).save(failed.value, ckpt, 84, {"step": 84})
    assert [step for step, _ in complete_checkpoints(tmp_path)] == [84]


def test_log_window_does_not_count_paused_time(monkeypatch: pytest.MonkeyPatch) -> None:
    from kubetrain.trainer.train import LogWindow

    clock = FakeClock()
    monkeypatch.setattr("kubetrain.trainer.train.time.perf_counter", clock)
    window = LogWindow(torch.device("cpu"), world_size=1, samples_per_step=32)
    clock.now += 2.0  # two steps of 1 s
    window.add(torch.tensor(1.0))
    window.add(torch.tensor(3.0))
    with window.paused():
        clock.now += 30.0  # a checkpoint and an eval
    monkeypatch.setattr("kubetrain.trainer.train.dist.all_reduce", lambda tensor: None)  # a world of one
    fields, vote = window.close(True)
    assert fields == {"loss": 2.0, "samples_per_s": 32.0, "step_time_s": 1.0}
    assert vote is True and window.last_loss == 2.0 and window.steps == 0


# --- metrics --------------------------------------------------------------------------------


def test_metrics_records_on_rank0_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    MetricsLogger(1, tmp_path / "r1").emit("step", step=1, epoch=0, loss=1.0)
    logger = MetricsLogger(0, tmp_path, total_steps=9)
    logger.emit("step", step=3, epoch=0, loss=float("nan"), lr=0.1, samples_per_s=10.0, step_time_s=0.5)
    logger.close()
    out, err = capsys.readouterr()
    [record] = [json.loads(line) for line in out.splitlines()]
    assert record["event"] == "step" and record["total_steps"] == 9 and record["loss"] is None
    assert set(record) == {
        "event",
        "time",
        "step",
        "epoch",
        "total_steps",
        "loss",
        "lr",
        "samples_per_s",
        "step_time_s",
    }
    assert json.loads((tmp_path / "metrics.jsonl").read_text()) == record
    assert "500.0 ms/step" in err
    assert not (tmp_path / "r1").exists()
    with pytest.raises(ValueError, match="unknown metrics event"):
        MetricsLogger(0, None).emit("bogus", step=0, epoch=0)


# --- preflight and imports ------------------------------------------------------------------


def test_preflight_names_rank_and_operation_of_a_wrong_result(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    from kubetrain.runtime.worker import dist as kdist
    from kubetrain.trainer.preflight import PreflightError, run_preflight

    ctx = kdist.setup("gloo", environ={})
    try:
        assert run_preflight(ctx, bandwidth=False)["ok"]
        real = dist.all_gather

        def corrupt(out: list[torch.Tensor], tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            result = real(out, tensor, *args, **kwargs)
            out[0].add_(7)
            return result

        monkeypatch.setattr(dist, "all_gather", corrupt)
        with pytest.raises(PreflightError, match=r"rank 0: all_gather: got \[7\.0\], expected \[0\.0\]"):
            run_preflight(ctx, bandwidth=False)
    finally:
        kdist.teardown()


def test_trainer_package_imports_without_torch_or_operator_deps() -> None:
    code = textwrap.dedent(
        """
        import sys
        import kubetrain.trainer, kubetrain.api.training, kubetrain.api.contract
        assert "torch" not in sys.modules, "config/contract must stay torch-free"
        import kubetrain.trainer.lib, kubetrain.trainer.train, kubetrain.trainer.preflight, kubetrain.trainer.__main__
        bad = sorted(m for m in sys.modules if m.split(".")[0] in ("kopf", "kubernetes"))
        bad += [m for m in sys.modules if m.startswith("kubetrain.operator")]
        assert not bad, bad
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_malformed_rank_is_a_contract_error_not_a_crash(tmp_path: Path) -> None:
    env = {**base_env(), "RANK": "x", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}
    done = subprocess.run(
        [sys.executable, "-m", "kubetrain.trainer", "preflight"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert "RANK='x' is not an integer" in done.stderr and "Traceback" not in done.stderr
