"""Every benchmark runs at a tiny size and writes its JSON: a clean-up that breaks one fails here
instead of rotting unnoticed (operator_latency.py once failed to import for weeks). The numbers
themselves are not checked: speed targets live in the benchmarks' own results."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.controlplane import ControlPlane, cache_dir, pinned

pytestmark = pytest.mark.bench

ROOT = Path(__file__).resolve().parents[1]


def run_benchmark(script: str, output: Path, *args: str, timeout: float = 600) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args, "--output", str(output)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"{script} exited {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    result: dict[str, Any] = json.loads(output.read_text())
    return result


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
def test_local_startup_benchmark_runs(tmp_path: Path) -> None:
    result = run_benchmark("local_startup.py", tmp_path / "startup.json", "--repeats", "1")
    assert result["repeats"] == 1 and result["to_first_step_s"]["median"] > 0


@pytest.mark.slow
def test_trainer_overhead_benchmark_runs(tmp_path: Path) -> None:
    tiny = ("--reps", "1", "--steps", "30", "--rounds", "1", "--block", "4")
    result = run_benchmark("trainer_overhead.py", tmp_path / "overhead.json", *tiny)
    assert len(result["loop_vs_hand"]["steady_ratio_per_rep"]) == 1
    assert result["checkpoint"]["save_ms_median"] > 0 and result["checkpoint"]["bytes"] > 0


@pytest.mark.slow
def test_teardown_stress_benchmark_runs(tmp_path: Path) -> None:
    # One run of each workload; the built-in trainer's teardown is ours, so it must be clean.
    result = run_benchmark(
        "teardown_stress.py", tmp_path / "teardown.json", "--runs", "2", "--load", "1", "--keep", str(tmp_path / "runs")
    )
    assert result["setup"] == {"runs": 2, "busy_loops": 1, "workloads": ["builtin", "byo"]}
    builtin, byo = result["runs"]
    assert (builtin["workload"], byo["workload"]) == ("builtin", "byo")
    for run in (builtin, byo):
        assert run["outcome"] == "Succeeded", run
        assert set(run["markers"]) == {"terminate_called", "exit_barrier", "traceback"}
    assert builtin["clean"], builtin
    assert result["totals"]["runs"] == 2 and result["totals"]["succeeded"] == 2
