"""The gang decision table: the rules (and their order) of the operator's status.decide."""

from __future__ import annotations

import pytest

from kubetrain.local.gang import Decision, decide

CASES = [
    # (exit codes, restarts, maxRestarts, elapsed, deadline, expected)
    ([None, None], 0, 3, 5.0, None, Decision("wait")),
    ([0, None], 0, 3, 5.0, None, Decision("wait")),
    ([0, 0], 0, 3, 5.0, None, Decision("succeed", "AllNodesSucceeded")),
    ([0, 0], 3, 3, 99.0, 10, Decision("succeed", "AllNodesSucceeded")),
    ([None, 1], 0, 3, 5.0, None, Decision("restart", "NodeFailed", 1, 1)),
    ([-9, 1], 2, 3, 5.0, None, Decision("restart", "NodeFailed", 0, -9)),
    ([0, 137], 2, 3, 5.0, None, Decision("restart", "NodeFailed", 1, 137)),
    ([None, 1], 3, 3, 5.0, None, Decision("fail", "BackoffLimitExceeded", 1, 1)),
    ([None, 1], 0, 0, 5.0, None, Decision("fail", "BackoffLimitExceeded", 1, 1)),
    ([None, None], 0, 3, 10.0, 10, Decision("fail", "DeadlineExceeded")),
    # A failure is handled before the deadline, as by the operator: the restart comes first
    # and the new attempt then meets the deadline.
    ([None, 1], 0, 3, 11.0, 10, Decision("restart", "NodeFailed", 1, 1)),
    ([None, 1], 3, 3, 11.0, 10, Decision("fail", "BackoffLimitExceeded", 1, 1)),
    ([None, None], 0, 3, 9.9, 10, Decision("wait")),
]


@pytest.mark.parametrize(("codes", "restarts", "max_restarts", "elapsed", "deadline", "expected"), CASES)
def test_decide(
    codes: list[int | None], restarts: int, max_restarts: int, elapsed: float, deadline: int | None, expected: Decision
) -> None:
    got = decide(codes, restarts=restarts, max_restarts=max_restarts, elapsed_s=elapsed, active_deadline_s=deadline)
    assert got == expected
