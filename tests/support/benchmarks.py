"""Running a benchmark of benchmarks/ at a small size, the way the smoke tests do."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from support.tools import ROOT


def run_benchmark(script: str, output: Path, *args: str, timeout: float = 600) -> dict[str, Any]:
    """Run benchmarks/`script` with `args` and `--output output`; its JSON, once it exited 0."""
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
