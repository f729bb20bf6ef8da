"""operator/forensics.py: faulthandler dumps in log tails -> every rank's stacks -> the rank that hung."""

from __future__ import annotations

from datetime import timedelta

import pytest
from support.jobs import bare_job
from support.pods import T0, pod_view

from kubetrain.api.models import Progress, TrainingJob, TrainingJobStatus
from kubetrain.operator.conditions import get_condition
from kubetrain.operator.forensics import Frame, RankStacks, blame, collect, parse
from kubetrain.operator.status import decide

pytestmark = pytest.mark.unit

TORCH = "/venv/lib/python3.11/site-packages/torch"
STDLIB = "/usr/lib/python3.11"


def dump(seconds: int, *threads: list[tuple[str, int, str]]) -> str:
    """faulthandler's dump_traceback_later output (most recent call first)."""
    lines = [f"Timeout (0:00:{seconds:02d})!"]
    for index, frames in enumerate(threads):
        lines.append(f"Thread 0x00007f00000{index:05x} (most recent call first):")
        lines += [f'  File "{path}", line {line} in {func}' for path, line, func in frames]
        lines.append("")
    return "\n".join(lines)


LOADER_THREAD = [(f"{STDLIB}/threading.py", 324, "wait"), (f"{STDLIB}/threading.py", 1002, "_bootstrap")]
IN_ALL_REDUCE = [
    (f"{TORCH}/distributed/c10d_logger.py", 81, "wrapper"),
    (f"{TORCH}/distributed/distributed_c10d.py", 2900, "all_reduce"),
    ("/app/train.py", 40, "step"),
    ("/app/train.py", 60, "<module>"),
]
IN_BACKWARD = [
    (f"{TORCH}/autograd/graph.py", 829, "_engine_run_backward"),
    (f"{TORCH}/_tensor.py", 626, "backward"),
    ("/app/train.py", 33, "step"),
    ("/app/train.py", 60, "<module>"),
]
STUCK_IN_LOADER = [
    (f"{STDLIB}/queue.py", 180, "get"),
    ("/app/data.py", 12, "next_batch"),
    ("/app/train.py", 60, "<module>"),
]


def test_parse_keeps_the_last_complete_dump_of_each_timeout() -> None:
    text = "\n".join(
        [
            "[step 5] loss 0.3",
            dump(15, LOADER_THREAD, IN_ALL_REDUCE[:1]),
            dump(15, LOADER_THREAD, IN_ALL_REDUCE),  # the repeat: the newest state
            dump(16, STUCK_IN_LOADER),  # local rank 1 of the same pod
            "Timeout (0:00:15)!",  # cut short by the end of the tail
        ]
    )
    dumps = parse(text)
    assert sorted(dumps) == [15, 16]
    assert [f.func for f in dumps[15][1]] == ["wrapper", "all_reduce", "step", "<module>"]
    stacks = collect({0: text, 1: dump(15, IN_BACKWARD)}, procs_per_node=2, stacks_after=15)
    assert sorted(stacks) == [0, 1, 2]  # node 0's local ranks 0 and 1, node 1's local rank 0
    assert stacks[1].user_frame == Frame("/app/data.py", 12, "next_batch")
    assert stacks[0].waiting_in == "wrapper" and stacks[2].waiting_in == "_engine_run_backward"
    assert stacks[1].waiting_in is None


# A worker the torchrun agent forked (the in-place restart's warm start) runs inside the agent's
# call stack: its frames end in the fork, then torchrun's own.
FORKED = [
    (f"{STDLIB}/runpy.py", 88, "_run_code"),
    ("/venv/lib/python3.11/site-packages/kubetrain/runtime/agent/warmstart.py", 170, "_become_worker"),
    ("/venv/lib/python3.11/site-packages/kubetrain/runtime/agent/warmstart.py", 125, "fork"),
    (f"{TORCH}/distributed/elastic/multiprocessing/subprocess_handler/subprocess_handler.py", 58, "__init__"),
    (f"{TORCH}/distributed/run.py", 1138, "main"),
]


def test_a_forked_worker_s_stack_ends_where_its_agent_s_begins() -> None:
    """Without the cut, the agent's torch.distributed frames would read as waiting in a collective."""
    hung = [("/app/train.py", 12, "block_forever"), ("/app/train.py", 60, "<module>"), *FORKED]
    waiting = [*IN_ALL_REDUCE, *FORKED]
    stacks = collect({0: dump(15, waiting), 1: dump(15, hung), 2: dump(15, waiting)}, 1, 15)
    assert [f.func for f in stacks[1].main] == ["block_forever", "<module>", "_run_code"]
    assert stacks[1].waiting_in is None and stacks[0].waiting_in == "wrapper"
    verdict = blame(stacks, 3)
    assert verdict.rank == 1 and "rank 1 not in the collective ranks 0, 2 wait in" in verdict.message, verdict


@pytest.mark.parametrize(
    ("stacks", "world", "rank", "said"),
    [
        (
            {0: IN_BACKWARD, 1: STUCK_IN_LOADER, 2: IN_ALL_REDUCE},
            3,
            1,
            "rank 1 not in the collective ranks 0, 2 wait in (_engine_run_backward, wrapper): "
            "rank 1 at /app/data.py:12 in next_batch; stacks of 3 of 3 ranks",
        ),
        ({0: IN_ALL_REDUCE, 2: IN_ALL_REDUCE}, 3, 1, "rank 1 wrote no stacks while ranks 0, 2 wait in wrapper"),
        (
            {0: STUCK_IN_LOADER, 1: STUCK_IN_LOADER, 2: [("/app/train.py", 70, "save"), *STUCK_IN_LOADER[2:]]},
            3,
            2,
            "rank 2's stack differs from every other rank's: at /app/train.py:70 in save",
        ),
        ({0: IN_ALL_REDUCE, 1: IN_ALL_REDUCE}, 2, None, "no single rank stands out: ranks 0, 1 at /app/train.py:40"),
        ({}, 2, None, "no rank wrote its stacks"),
    ],
    ids=["not-in-the-collective", "no-stacks", "differs", "all-alike", "none"],
)
def test_blame(stacks: dict[int, list[tuple[str, int, str]]], world: int, rank: int | None, said: str) -> None:
    loader = tuple(Frame(*f) for f in LOADER_THREAD)
    found = {r: RankStacks(r, (loader, tuple(Frame(*f) for f in s))) for r, s in stacks.items()}
    verdict = blame(found, world)
    assert verdict.rank == rank and said in verdict.message, verdict


def test_a_stall_decided_with_stacks_names_the_culprit_in_the_condition_and_failures() -> None:
    metadata = {"namespace": "ns", "uid": "u", "generation": 1}
    job = TrainingJob.model_validate(bare_job(metadata=metadata, nodes=3, runPolicy={"hangTimeoutSeconds": 60}))
    pods = [pod_view(job, r, phase="Running", job_uid="u") for r in range(3)]
    first = decide(job, "u", pods, True, T0)
    running = first.status.model_copy(update={"progress": Progress(step=5, updated_at=T0)})
    job = job.model_copy(update={"status": TrainingJobStatus.model_validate(running.wire())})
    frames = {0: IN_BACKWARD, 1: STUCK_IN_LOADER, 2: IN_ALL_REDUCE}
    stacks = {r: RankStacks(r, (tuple(Frame(*f) for f in s),)) for r, s in frames.items()}
    d = decide(job, "u", pods, True, T0 + timedelta(seconds=61), stacks=stacks)
    (failure,) = d.status.failures or []
    assert (failure.reason, failure.rank, failure.pod) == ("Stalled", 1, "j-node-1")
    assert "rank 1 at /app/data.py:12 in next_batch" in failure.message
    stalled = get_condition(d.status, "Stalled")
    assert stalled is not None and "rank 1 not in the collective" in stalled.message
