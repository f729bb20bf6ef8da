"""Every benchmark runs at a tiny size and writes its JSON: a clean-up that breaks one fails here
instead of rotting unnoticed (operator_latency.py once failed to import for weeks). The numbers
themselves are not checked: speed targets live in the benchmarks' own results."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.benchmarks import run_benchmark
from support.controlplane import ControlPlane, cache_dir, pinned

pytestmark = pytest.mark.bench

ROOT = Path(__file__).resolve().parents[1]


def test_operator_latency_benchmark_runs(control_plane: ControlPlane, tmp_path: Path) -> None:
    # control_plane: the benchmark starts its own from the same binaries; the fixture makes a
    # missing binary a skip (a failure in CI) with the usual message.
    result = run_benchmark(
        "operator_latency.py", tmp_path / "latency.json", "--jobs", "2", "--nodes", "2", "--repeat", "1"
    )
    (run,) = result["runs"]
    assert run["operator"] == "kubetrain" and run["children_per_job"] == 3
    assert run["latency_s"]["p50"] > 0 and run["api_writes_per_job"] > 0 and run["operator_cpu_s"] > 0
    assert run["warm_up_s"] > 0  # the warm-up job ran before the burst...
    # ...and outside its figures: 2 nodes write 5 objects per job (2 pods, 1 Service, 2 status
    # patches); the warm-up's 5 counted too would make (5 + 5 * 2) / 2 = 7.5.
    assert run["api_writes_per_job"] < 7.5, run["api_writes_by_kind"]
    assert result["summary"]["by_operator"]["kubetrain"]["per_run"]["p50_s"] == [run["latency_s"]["p50"]]


def test_operator_latency_kubeflow_peer_runs(control_plane: ControlPlane, tmp_path: Path) -> None:
    built = cache_dir() / f"kubeflow-training-operator-{pinned('KUBEFLOW_VERSION')}" / ".complete"
    if not built.exists():
        pytest.skip(f"{built} missing: run tests/cluster/install.sh")
    result = run_benchmark(
        "operator_latency.py",
        tmp_path / "peer.json",
        "--jobs",
        "2",
        "--nodes",
        "2",
        "--repeat",
        "1",
        "--peer",
        "kubeflow",
    )
    runs = {run["operator"]: run for run in result["runs"]}
    assert sorted(runs) == ["kubeflow", "kubeflow-tuned", "kubetrain"]
    # Kubeflow: a pod and a Service per replica (Master 1 + Worker 1).
    assert runs["kubeflow"]["children_per_job"] == 4 and runs["kubeflow"]["api_writes_per_job"] > 0
    ratios = result["summary"]["ratios"]
    assert sorted(ratios) == ["kubetrain/kubeflow", "kubetrain/kubeflow-tuned"]
    assert ratios["kubetrain/kubeflow-tuned"]["p50_s"] > 0


def test_operator_scale_benchmark_runs(control_plane: ControlPlane, tmp_path: Path) -> None:
    sizes = ("--wide-nodes", "3", "--held-jobs", "2", "--held-nodes", "2", "--restart-nodes", "2")
    result = run_benchmark("operator_scale.py", tmp_path / "scale.json", *sizes)
    assert result["wide"]["floor"]["objects"] == 4 and result["wide"]["ratio_to_floor"] > 0
    assert result["held"]["rss_mib"]["all"] > 0 and "growth_mib_per_job" in result["held"]
    assert result["restart"]["delete_to_all_recreated_s"] > 0


@pytest.mark.slow
def test_operator_failover_benchmark_runs(control_plane: ControlPlane, tmp_path: Path) -> None:
    # A short lease: the SIGKILL round waits it out.
    lease = ("--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "1")
    sizes = ("--jobs", "2", "--nodes", "2", "--steady-seconds", "2", "--rounds", "1")
    result = run_benchmark("operator_failover.py", tmp_path / "failover.json", *sizes, *lease)
    assert result["steady"]["standby"]["rss_mib"] > 0 and result["steady"]["leader"]["rss_mib"] > 0
    assert [r["how"] for r in result["rounds"]] == ["sigkill", "sigterm"]
    for how in ("sigkill", "sigterm"):
        figures = result["summary"][how]
        assert 0 < figures["takeover_s"]["max"] <= figures["new_job_pods_s"]["max"], figures
    # A killed leader's Lease runs out (4 s); a released one is taken at once.
    assert result["summary"]["sigkill"]["takeover_s"]["min"] > result["summary"]["sigterm"]["takeover_s"]["max"]


def test_local_startup_benchmark_runs(tmp_path: Path) -> None:
    result = run_benchmark("local_startup.py", tmp_path / "startup.json", "--repeats", "1")
    assert result["repeats"] == 1 and result["to_first_step_s"]["median"] > 0


def test_survivor_save_benchmark_runs(tmp_path: Path) -> None:
    result = run_benchmark("survivor_save.py", tmp_path / "survivor.json", "--repeats", "1")
    runs = {run["variant"]: run for run in result["runs"]}
    assert sorted(runs) == ["off", "survivor"]
    assert runs["survivor"]["resumed_reason"] == "peer_lost" and runs["off"]["resumed_reason"] == "epoch"
    assert result["summary"]["ratio_failure_to_training_survivor_over_off"] > 0


def test_elastic_resize_benchmark_runs(tmp_path: Path) -> None:
    result = run_benchmark("elastic_resize.py", tmp_path / "elastic.json", "--repeats", "1")
    runs = {run["variant"]: run for run in result["runs"]}
    assert sorted(runs) == ["elastic", "fixed"]
    assert runs["elastic"]["resizes"] == [[0, 3], [3, 2], [2, 3]] and runs["elastic"]["restarts"] == 0
    assert runs["fixed"]["restarts"] == 1 and runs["elastic"]["steps_lost"] == 0
    assert result["summary"]["ratio_shrink_over_recreate"] > 0


@pytest.mark.slow
def test_trainer_overhead_benchmark_runs(tmp_path: Path) -> None:
    tiny = ("--reps", "1", "--steps", "30", "--rounds", "1", "--block", "4")
    result = run_benchmark("trainer_overhead.py", tmp_path / "overhead.json", *tiny)
    assert len(result["loop_vs_hand"]["steady_ratio_per_rep"]) == 1
    assert result["checkpoint"]["save_ms_median"] > 0 and result["checkpoint"]["bytes"] > 0


def test_checkpoint_upload_benchmark_runs(tmp_path: Path) -> None:
    tiny = ("--models", "digits", "--saves", "2", "--steps-between", "2")
    result = run_benchmark("checkpoint_upload.py", tmp_path / "upload.json", *tiny)
    digits = result["models"]["digits"]
    assert digits["saves_per_arm"] == 2 and digits["checkpoint_bytes"] > 0
    assert all(len(digits[arm]["stalls_s"]) == 2 for arm in ("volume", "sync", "background"))
    # The steps beside an upload are told from those after it: a slowdown only where some ran.
    during = digits["background"]["steps_during_upload"]
    assert (digits["step_slowdown_during_upload"] is None) == (during == 0), digits
    assert result["targets"]["100m_background_stall_at_most_half_the_sync_stall"] is None  # not measured


@pytest.mark.slow
def test_teardown_stress_benchmark_runs(tmp_path: Path) -> None:
    # One run of the built-in trainer, a plain script and the smallest third-party one (Kubeflow's
    # demo), each in its own working directory; the built-in trainer's teardown is ours, so it must be clean.
    workloads = ("--workloads", "builtin,byo,kubeflow", "--keep", str(tmp_path / "runs"))
    result = run_benchmark("teardown_stress.py", tmp_path / "teardown.json", "--runs", "1", "--load", "1", *workloads)
    assert result["setup"]["runs_per_workload"] == 1 and result["setup"]["hooks"] is True
    builtin, byo, kubeflow = result["runs"]
    assert (builtin["workload"], byo["workload"], kubeflow["workload"]) == ("builtin", "byo", "kubeflow")
    for run in (builtin, byo, kubeflow):
        assert run["outcome"] == "Succeeded" and run["reached_end"] and run["hooks"] is True, run
        assert set(run["markers"]) == {"terminate_called", "exit_barrier", "traceback"}
    assert builtin["clean"], builtin
    assert (tmp_path / "runs" / "work-002-kubeflow" / "demo.py").is_file()
    assert result["by_workload"]["kubeflow"]["runs"] == 1 and result["totals"]["succeeded"] == 3


@pytest.mark.slow
def test_teardown_stress_without_hooks_runs_the_same_job_without_them(tmp_path: Path) -> None:
    # The nodes' PYTHONPATH must really lack the hooks: the run records what it got, read back
    # from its own local-rewrites.json.
    bare = ("--workloads", "kubeflow", "--no-hooks")
    result = run_benchmark("teardown_stress.py", tmp_path / "bare.json", "--runs", "1", "--load", "0", *bare)
    (run,) = result["runs"]
    assert result["setup"]["hooks"] is False and run["hooks"] is False, run
    assert run["outcome"] == "Succeeded" and run["reached_end"], run


@pytest.mark.slow
def test_client_overhead_benchmark_runs(tmp_path: Path) -> None:
    result = run_benchmark("client_overhead.py", tmp_path / "client.json", "--repeats", "1", "--polls", "5")
    local = result["per_poll"]["local"]
    assert local["polls"] == 5 and local["wall_ms"]["median"] > 0 and local["cpu_ms"]["median"] > 0
    startup = result["startup"]
    (run,) = startup["runs"]
    assert run["client"]["to_first_step_s"] > run["client"]["call_returned_s"] > 0
    assert run["command"]["to_first_step_s"] > 0 and startup["ratio_client_to_command"]["median"] > 0


def test_client_overhead_benchmark_polls_a_cluster(control_plane: ControlPlane, tmp_path: Path) -> None:
    # control_plane: the benchmark starts its own from the same binaries (a missing one: the usual skip).
    result = run_benchmark(
        "client_overhead.py", tmp_path / "client.json", "--repeats", "0", "--polls", "5", "--cluster"
    )
    assert result["per_poll"]["kubernetes"]["polls"] == 5 and result["per_poll"]["kubernetes"]["wall_ms"]["median"] > 0
    assert result["startup"] == {"repeats": 0}


@pytest.mark.slow
def test_stop_on_signal_benchmark_runs(tmp_path: Path) -> None:
    tiny = ("--models", "digits", "--rounds", "2", "--block-seconds", "0.05", "--stop-models", "digits", "--reps", "1")
    result = run_benchmark("stop_on_signal.py", tmp_path / "stop.json", *tiny)
    vote = result["vote"]["models"]["digits"]
    assert vote["blocks_per_arm"] == 2 and vote["vote_alone_us"] > 0
    # The arm emulating a vote after every step does vote after every step; the product's votes less often.
    assert vote["votes_per_step"]["vote_every_step"] == 1.0
    assert vote["votes_per_step"]["vote"] < 1.0, vote["votes_per_step"]
    assert isinstance(vote["cpu"]["vote_within_noise"], bool)
    (run,) = result["stop"]["models"]["digits"]["runs"]
    assert run["exit_code"] == 130, run
    # The stop saved a step no older than the last one logged before the signal: nothing lost.
    assert run["saved_step"] >= run["last_step_logged_before_signal"], run
    assert 0 < run["signal_to_checkpoint_s"] <= run["signal_to_nodes_exit_s"] <= run["signal_to_command_exit_s"]
    assert run["checkpoint_bytes"] > 0


@pytest.mark.slow
def test_stall_false_positives_benchmark_runs(tmp_path: Path) -> None:
    # A timeout above the start-up of a loaded machine (seen up to ~40 s at load 20): a shorter one trips
    # on the start-up itself (docs/benchmarks-24.md), before the hang this run injects.
    tiny = ("--runs", "1", "--steps", "3", "--step-ms", "500", "--timeout", "60", "--load", "1")
    result = run_benchmark("stall_false_positives.py", tmp_path / "stall.json", *tiny, timeout=900)
    (run,) = result["runs"]
    assert run["outcome"] == "Succeeded" and run["steps"] >= 3, run
    assert set(result["totals"]) >= {"stalled_conditions", "stalled_failures", "restarts", "stack_dump_lines"}
    # The opposite check is the product's promise, so it is asserted even at this size.
    verdict = result["hang_check"]["verdict"]
    assert verdict["stalled"] and verdict["blamed_rank"] == 1 and verdict["names_the_line"], verdict
    assert verdict["nodes_with_stacks"] == [0, 1], verdict
    assert result["hang_check"]["outcome"] == "Succeeded", result["hang_check"]


def test_framework_adapters_benchmark_runs(tmp_path: Path) -> None:
    tiny = ("--reps", "1", "--steps", "14", "--plain-steps", "60")
    result = run_benchmark("framework_adapters.py", tmp_path / "adapters.json", *tiny)
    assert len(result["summary"]["hf_trainer"]["ratio_per_rep"]) == 1
    assert result["summary"]["plain_ddp_step_watch"]["hook_us_per_step"] > 0
