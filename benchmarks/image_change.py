"""A one-line change to a trainer module, from the edit to a pod of the rebuilt trainer image that
runs the changed line on the real node: tests/cluster/build-images.sh on a copy of this tree with
the line added, the import of what the node's containerd lacks, and the pod's create -> Succeeded
with the line's value in its log. Side by side in the same run, the import of the whole images into
a store that holds none of them (what each change moved before the images had layers of their own:
the trainer was one 6 GB layer, rebuilt, archived and imported whole).

    sudo .venv/bin/python benchmarks/image_change.py [--output FILE]

Needs root, `bash tests/cluster/install.sh` and the images of this tree built (the script's warm
state). It rebuilds them for this tree at the end, since the layout keeps one build's tags.
Writes benchmarks/results/image_change.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from support import images  # noqa: E402
from support import node as real  # noqa: E402
from support.controlplane import Unavailable  # noqa: E402
from support.ocilayout import LayoutImage  # noqa: E402
from support.realnode import image_store  # noqa: E402
from support.waiting import wait_for  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "image_change.json"
CHANGED_MODULE = "kubetrain.trainer.cursor"
CHANGED_FILE = "trainer/cursor.py"
NAMESPACE = "image-change"
TARGET_S = 90


def build(tree: Path) -> tuple[dict[str, LayoutImage], float, list[str]]:
    """build-images.sh for `tree`: its images, seconds and its timing lines."""
    env = {
        **os.environ,
        "KUBETRAIN_VENV": str(ROOT / ".venv"),
        "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}",
    }
    t0 = time.monotonic()
    done = subprocess.run(
        ["bash", str(tree / "tests" / "cluster" / "build-images.sh")],
        capture_output=True, text=True, env=env, timeout=3600, check=False,
    )  # fmt: skip
    seconds = time.monotonic() - t0
    if done.returncode != 0:
        sys.exit(f"build-images.sh failed for {tree}:\n{done.stderr[-5000:]}")
    built = images.parse_printed(done.stdout, f"build-images.sh for {tree}")
    return built, seconds, [line for line in done.stderr.splitlines() if line.startswith("[images")]


def run_pod(node: real.RealNode, name: str, code: str) -> tuple[float, str]:
    """A pod of the trainer image running `code`: seconds from create to Succeeded, and its log."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "c",
                    "image": images.TRAINER_REF,
                    "imagePullPolicy": "Never",
                    "command": ["python", "-c", code],
                }
            ],
        },
    }
    t0 = time.monotonic()
    node.cp.kubectl("apply", "-f", "-", input=json.dumps(pod))

    def phase() -> str:
        return node.cp.kubectl("get", "pod", name, "-n", NAMESPACE, "-o", "jsonpath={.status.phase}").stdout

    wait_for(lambda: phase() in ("Succeeded", "Failed"), 300, f"pod {name} finished", interval=0.2)
    seconds = time.monotonic() - t0
    log = node.cp.kubectl("logs", name, "-n", NAMESPACE).stdout.strip()
    if phase() != "Succeeded":
        sys.exit(f"pod {name} failed: {log}")
    return seconds, log


def timed_load(node: real.RealNode, loadables: list[images.Loadable]) -> tuple[float, int]:
    """Seconds to load `loadables`, and how many blobs the store lacked before."""
    have = set(node.ctr("content", "ls", "-q").stdout.split())
    lacking = {
        blob["digest"]
        for item in loadables
        if isinstance(item, tuple)
        for blob in item[1].blobs()
        if blob["digest"] not in have
    }
    t0 = time.monotonic()
    node.load_images(loadables)
    return time.monotonic() - t0, len(lacking)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    reason = real.missing()
    if reason:
        sys.exit(f"no real node here: {reason}")
    try:
        current = images.node_images(images.OPERATOR_REF, images.TRAINER_REF)
    except Unavailable as missing:
        sys.exit(str(missing))
    store_bytes = (
        sum(f.stat().st_size for f in image_store().rglob("*") if f.is_file()) if image_store().exists() else 0
    )
    marker = f"changed-{time.time_ns()}"
    try:
        with tempfile.TemporaryDirectory(prefix="image-change-") as tmp, real.running_node() as node:
            node.cp.kubectl("create", "namespace", NAMESPACE)
            # Setup: the node holds this tree's images (an empty store imports all of them: timed).
            setup_load_s, setup_blobs = timed_load(node, current)
            setup_pod_s, _ = run_pod(node, "before", "import kubetrain.trainer")
            tree = images.copy_build_inputs(Path(tmp) / "tree")
            with (tree / CHANGED_FILE).open("a") as module:
                module.write(f"\nIMAGE_CHANGE_MARKER = {marker!r}\n")
            changed, build_s, build_log = build(tree)
            loadables: list[images.Loadable] = [
                (ref, changed[ref]) for ref in (images.OPERATOR_REF, images.TRAINER_REF)
            ]
            load_s, load_blobs = timed_load(node, loadables)
            pod_s, log = run_pod(node, "after", f"import {CHANGED_MODULE} as m; print(m.IMAGE_CHANGE_MARKER)")
            if log != marker:
                sys.exit(f"the pod printed {log!r}, not the changed line's {marker!r}")
            trainer = changed[images.TRAINER_REF]
            own_layers = [layer["size"] for layer in trainer.manifest()["layers"]]
    finally:
        # The layout keeps one build's tags: this tree's images again, whatever happened above.
        _, restore_s, _ = build(ROOT)
    total_s = build_s + load_s + pod_s
    report: dict[str, Any] = {
        "benchmark": "image_change",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "logical_cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_average_end": os.getloadavg(),
        },
        "change": f"one line appended to {CHANGED_FILE}",
        "node_store_bytes_at_start": store_bytes,
        "setup": {
            "load_s": round(setup_load_s, 1),
            "blobs_imported": setup_blobs,
            # Every layer imported: the store held none of them, as after each change before the layers.
            "layers_in_images": sum(len(item[1].blobs()) for item in current if isinstance(item, tuple)),
            "pod_s": round(setup_pod_s, 1),
        },
        "change_to_pod": {
            "build_s": round(build_s, 1),
            "import_s": round(load_s, 1),
            "blobs_imported": load_blobs,
            "pod_create_to_succeeded_s": round(pod_s, 1),
            "total_s": round(total_s, 1),
            "build_log": build_log,
        },
        "trainer_layers_bytes": own_layers,
        "rebuild_for_this_tree_s": round(restore_s, 1),
        "targets": {f"change_to_pod_under_{TARGET_S}_s": total_s < TARGET_S},
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(
        json.dumps(
            {k: v for k, v in report.items() if k != "change_to_pod"}
            | {"change_to_pod": {k: v for k, v in report["change_to_pod"].items() if k != "build_log"}},
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
