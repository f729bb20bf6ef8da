"""Rank-0 metrics records (written by `kubetrain.runtime.records`; their names live in
`kubetrain.api.record_format`, their parser in `kubetrain.api.records`) and per-rank log lines.
Humans read stderr. Other ranks print nothing on stdout, and only warnings and errors, prefixed
with their rank, on stderr.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any, TextIO

from kubetrain.api.record_format import EVENTS, MARKS, METRICS_FILE
from kubetrain.runtime import records

log = logging.getLogger("kubetrain.trainer")


def configure_logging(rank: int, stream: TextIO | None = None) -> None:
    """Rank 0 logs INFO and up; other ranks WARNING and up, prefixed `[rank N]`."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(logging.Formatter(f"[rank {rank}] %(levelname)s %(message)s"))
    log.handlers[:] = [handler]
    log.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    log.propagate = False


def _human(record: dict[str, Any]) -> str:
    event = record["event"]
    head = f"{event:<10} step {record['step']}/{record['total_steps']} epoch {record['epoch']}"
    parts = []
    for key, fmt in (
        ("loss", "loss {:.4f}"),
        ("eval_loss", "eval_loss {:.4f}"),
        ("accuracy", "accuracy {:.4f}"),
        ("lr", "lr {:.3g}"),
        ("samples_per_s", "{:.0f} samples/s"),
        ("step_time_s", "{:.1f} ms/step"),
        ("world_size", "world {}"),
        ("backend", "{}"),
        ("resumed_from", "resumed from {}"),
        ("path", "{}"),
        ("ok", "ok={}"),
    ):
        value = record.get(key)
        if value is None:
            continue
        parts.append(fmt.format(value * 1000 if key == "step_time_s" else value))
    return "  ".join([head, *parts])


class MetricsLogger:
    """Writes the metrics records; a no-op on ranks other than 0."""

    def __init__(self, rank: int, directory: str | Path | None, *, total_steps: int = 0, stdout: bool = True) -> None:
        self.rank = rank
        self.total_steps = total_steps
        self.stdout = stdout
        self.path = Path(directory) / METRICS_FILE if directory is not None else None
        self._file: TextIO | None = None
        if rank == 0 and self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", encoding="utf-8")

    def emit(self, event: str, *, step: int, epoch: int, **fields: Any) -> dict[str, Any] | None:
        if event not in EVENTS or event in MARKS:
            raise ValueError(f"unknown metrics event {event!r}; expected one of {EVENTS} but {MARKS}")
        if self.rank != 0:
            return None
        record = self._record(event, step=step, epoch=epoch, total_steps=self.total_steps, **fields)
        print(_human(record), file=sys.stderr, flush=True)
        return record

    def mark(self, event: str, **fields: Any) -> dict[str, Any] | None:
        """A record without a step (`rendezvous`): it marks the attempt's start-up, not progress."""
        if event not in MARKS:
            raise ValueError(f"unknown mark {event!r}; expected one of {MARKS}")
        if self.rank != 0:
            return None
        record = self._record(event, **fields)
        details = "  ".join(f"{key} {value}" for key, value in fields.items())
        print(f"{event:<10} {details}".rstrip(), file=sys.stderr, flush=True)
        return record

    def _record(self, event: str, **fields: Any) -> dict[str, Any]:
        return records.write(event, fields, stream=sys.stdout if self.stdout else None, file=self._file)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
