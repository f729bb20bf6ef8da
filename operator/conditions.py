"""metav1.Condition bookkeeping on a TrainingJobStatus, and the phase derived from it."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Literal

from kubetrain.api.models import Condition, Phase, TrainingJobStatus


def get_condition(status: TrainingJobStatus, kind: str) -> Condition | None:
    return next((c for c in status.conditions or [] if c.type == kind), None)


def is_true(status: TrainingJobStatus, kind: str) -> bool:
    condition = get_condition(status, kind)
    return condition is not None and condition.status == "True"


def _reason(text: str) -> str:
    """A metav1.Condition reason (CamelCase identifier) from free text such as 'OOMKilled'."""
    cleaned = re.sub(r"[^A-Za-z0-9_,:]", "", text) or "Unknown"
    if not cleaned[0].isalpha():
        cleaned = "Reason" + cleaned
    return cleaned.rstrip(",:")[:1024]


def set_condition(
    status: TrainingJobStatus,
    kind: str,
    value: bool,
    reason: str,
    message: str,
    now: datetime,
    generation: int | None,
    *,
    only_if_present: bool = False,
) -> bool:
    """Set a condition; lastTransitionTime moves only when its status flips. Returns whether it flipped."""
    conditions = list(status.conditions or [])
    wanted: Literal["True", "False"] = "True" if value else "False"
    existing = next((c for c in conditions if c.type == kind), None)
    if existing is None and only_if_present:
        return False
    flipped = existing is None or existing.status != wanted
    condition = Condition(
        type=kind,
        status=wanted,
        reason=_reason(reason),
        message=message[:32_768],
        last_transition_time=now if flipped or existing is None else existing.last_transition_time,
        observed_generation=generation,
    )
    if existing is None:
        conditions.append(condition)
    else:
        conditions[conditions.index(existing)] = condition
    status.conditions = conditions
    return flipped


def derive_phase(status: TrainingJobStatus) -> Phase:
    for kind in ("Failed", "Succeeded", "Suspended", "Restarting", "Running"):
        if is_true(status, kind):
            return kind
    return "Pending"
