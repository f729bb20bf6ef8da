"""kubetrain.runtime.guest.guest_records: the records written from inside a user's process."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kubetrain.api import contract, records
from kubetrain.runtime.guest import guest_records

pytestmark = pytest.mark.unit


def test_a_record_goes_to_the_stream_and_the_metrics_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(contract.ATTEMPT_ENV, "3")
    out = io.StringIO()
    guest_records.write("step", out=out, directory=tmp_path / "ckpt", step=7, loss=float("nan"))
    (line,) = out.getvalue().splitlines()
    assert (tmp_path / "ckpt" / records.METRICS_FILE).read_text() == line + "\n"
    record = records.parse_record(line)
    assert record is not None and (record["attempt"], record["step"], record["loss"]) == (3, 7, None)
    guest_records.write("step", out=out, step=8)  # no directory: the stream only
    assert len((tmp_path / "ckpt" / records.METRICS_FILE).read_text().splitlines()) == 1


def test_importing_it_imports_no_pydantic() -> None:
    code = "import sys, kubetrain.runtime.guest.guest_records; print('pydantic' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
        == "False"
    )


def test_one_line_per_record_json() -> None:
    out = io.StringIO()
    guest_records.write("done", out=out, step=1)
    assert json.loads(out.getvalue())["event"] == "done"


def test_the_rendezvous_is_marked_once_per_process_by_rank_0_of_a_worker(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(guest_records, "_rendezvous_marked", False)
    monkeypatch.setattr(guest_records, "world", lambda: (2, "gloo"))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "j")
    monkeypatch.setenv("RANK", "1")
    assert not guest_records.rendezvous()  # not rank 0
    monkeypatch.setenv("RANK", "0")
    assert guest_records.rendezvous() and not guest_records.rendezvous()  # step_watch, then an adapter
    (line,) = capsys.readouterr().out.splitlines()
    record = records.parse_record(line)
    assert record is not None and (record["event"], record["world_size"], record["backend"]) == (
        "rendezvous",
        2,
        "gloo",
    )
