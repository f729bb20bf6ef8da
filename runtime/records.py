"""The one writer of the records kubetrain's runtime prints: rank 0's metrics (worker.metrics), a
user's worker's (guest.guest_records), torchrun's agent's marks (agent.inplace) and the wall's
fallbacks (torch_private). One JSON object a line, in the format kubetrain.api.records parses
(its names in kubetrain.api.record_format); the operator and `kubetrain run --local` read them from
the pod's log or from `metrics.jsonl`.

Standard library only (this runs in any image, before a script's own imports), Python 3.10 and later.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from kubetrain.api.record_format import METRICS_FILE
from kubetrain.runtime.store import gang_attempt

# Records also come from a background thread (an object-store checkpoint's commit, a framework's
# callback): one line at a time, whichever writes it.
_lock = threading.Lock()


def clean(value: Any) -> Any:
    """JSON has no NaN or Infinity: a diverged loss is reported as null, not as invalid JSON."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def write(
    event: str,
    fields: Mapping[str, Any],
    *,
    stream: TextIO | None = None,
    file: TextIO | None = None,
    directory: str | Path | None = None,
    attempt_from_env: bool = True,
) -> dict[str, Any]:
    """The record `event` with `fields` (after `event` and `time`, which a field may override), as
    one line written and flushed to each of `stream` (stdout, the pod's log), the open metrics
    `file`, and `<directory>/metrics.jsonl` (made where missing, opened for that line only) that
    is given. `attempt_from_env`: the attempt this process runs (KUBETRAIN_ATTEMPT) comes right
    after `time`, where it is set: a restarted gang's rank 0 may log into the same output as the
    attempt before it. The agent, which names the attempt itself, and the wall's fallbacks go
    without. The record written."""
    record: dict[str, Any] = {"event": event, "time": time.time()}
    attempt = gang_attempt() if attempt_from_env else None
    if attempt is not None:
        record["attempt"] = attempt
    record.update({key: clean(value) for key, value in fields.items()})
    line = json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n"
    with _lock:
        for out in (stream, file):
            if out is not None:
                out.write(line)
                out.flush()
        if directory:
            Path(directory).mkdir(parents=True, exist_ok=True)
            with (Path(directory) / METRICS_FILE).open("a", encoding="utf-8") as appended:
                appended.write(line)
    return record
