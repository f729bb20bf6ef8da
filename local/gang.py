"""Gang semantics as one pure decision: what to do next, given how the nodes of an attempt ended.

`kubetrain run --local` drives its processes with this function; the operator's status
module makes the same decision from pods. Keeping it a function of observed exits and
counters (no processes, no clocks) lets the two be compared table by table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

REASON_SUCCEEDED = "AllNodesSucceeded"
REASON_BACKOFF_LIMIT = "BackoffLimitExceeded"
REASON_DEADLINE = "DeadlineExceeded"
REASON_NODE_FAILED = "NodeFailed"

ActionKind = Literal["wait", "succeed", "restart", "fail"]


@dataclass(frozen=True)
class Decision:
    action: ActionKind
    reason: str = ""
    # The node whose exit caused a restart or failure (lowest rank among the failed).
    failed_rank: int | None = None
    exit_code: int | None = None


def decide(
    exit_codes: Sequence[int | None],
    *,
    restarts: int,
    max_restarts: int,
    elapsed_s: float,
    active_deadline_s: float | None,
) -> Decision:
    """The next step of a gang whose node `i` exited with `exit_codes[i]` (None: still running).

    In the order of the operator's `status.decide`:
    - any node exited non-zero: stop the others and restart the whole gang, unless
      `max_restarts` restarts were already made: then fail, BackoffLimitExceeded;
    - every node exited 0: succeed (a node that finished waits for the others);
    - past activeDeadlineSeconds (counted from the job's first start): fail, DeadlineExceeded;
    - otherwise keep waiting.
    """
    failed = [(rank, code) for rank, code in enumerate(exit_codes) if code not in (None, 0)]
    if failed:
        rank, code = failed[0]
        if restarts >= max_restarts:
            return Decision("fail", REASON_BACKOFF_LIMIT, rank, code)
        return Decision("restart", REASON_NODE_FAILED, rank, code)
    if exit_codes and all(code == 0 for code in exit_codes):
        return Decision("succeed", REASON_SUCCEEDED)
    if active_deadline_s is not None and elapsed_s >= active_deadline_s:
        return Decision("fail", REASON_DEADLINE)
    return Decision("wait")
