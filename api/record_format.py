"""The names of rank 0's metrics records: which events exist, which only mark an attempt, and the
file they are appended to. kubetrain.api.records holds their parser and fold (with the models);
these names are apart because the runtime beside user code (kubetrain.runtime.bundle)
writes records in any image: standard library only, Python 3.10 and later.
"""

from __future__ import annotations

REFUSED = "checkpoint_refused"
SKIPPED = "checkpoint_skipped"
FALLBACK = "fallback"
EVENTS = (
    "start",
    "step",
    "eval",
    "checkpoint",
    "resume",
    "preflight",
    "done",
    REFUSED,
    SKIPPED,
    "rendezvous",
    "launch",
    "failure",
    FALLBACK,
    "standby",
)
# Records of an attempt's start-up and end, and of the runtime's fallbacks: not training progress.
MARKS = ("rendezvous", "launch", "failure", FALLBACK, "standby")
METRICS_FILE = "metrics.jsonl"
