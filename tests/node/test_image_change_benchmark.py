"""benchmarks/image_change.py runs on the real node and writes its JSON: a line appended to a
trainer module is in a pod of the rebuilt trainer image (the pod prints it, or the benchmark
fails), and what moved were kubetrain's own layers, not torch's."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import images, nodepods
from support.benchmarks import run_benchmark
from support.controlplane import Unavailable

pytestmark = pytest.mark.bench
ROOT = Path(__file__).resolve().parents[2]


def test_a_changed_line_reaches_a_pod_by_the_small_layers(tmp_path: Path) -> None:
    nodepods.node_or_skip()
    try:
        trainer = images.built(images.TRAINER_REF)[images.TRAINER_REF]
    except Unavailable as missing:
        pytest.skip(str(missing))
    result = run_benchmark("image_change.py", tmp_path / "image_change.json", timeout=1800)
    change = result["change_to_pod"]
    # The build wrote the operator's and the trainer's new top layers (and their manifests and
    # configs); torch's layers were in the node's store already.
    torch_layer = max(layer["size"] for layer in trainer.manifest()["layers"])
    assert max(result["trainer_layers_bytes"]) == torch_layer
    assert 0 < change["blobs_imported"] < result["setup"]["layers_in_images"]
    assert change["total_s"] == pytest.approx(
        change["build_s"] + change["import_s"] + change["pod_create_to_succeeded_s"], abs=0.2
    )
    # The tree's own images are back in the layout for the tests after this one.
    assert images.built(images.TRAINER_REF)[images.TRAINER_REF] == trainer
