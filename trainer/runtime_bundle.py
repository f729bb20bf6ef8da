"""kubetrain's runtime as files, for images that lack kubetrain.

The runtime is what runs beside user code: the torchrun hooks, the in-place agent, the stop vote,
the hang watchdog, the records and the framework adapters (kubetrain.trainer.torchrun_hooks and
what it imports), and the runner of the functions Client.train ships (kubetrain.trainer.function),
so that a Kubeflow-style function runs in an image without kubetrain too. It needs only the
standard library and the torch it finds, on Python 3.10 and later (tests/trainer/
test_runtime_bundle.py checks both), so it runs in any image with torch.

The operator gives every training pod an init container of kubetrain's operator image that runs

    python -m kubetrain.trainer.runtime_bundle /kubetrain-runtime

into an emptyDir, and the training container `PYTHONPATH=/kubetrain-runtime/site`
(operator/render.py, docs/images.md). That folder holds one file, the `sitecustomize` that
`kubetrain run --local` puts first on PYTHONPATH too (local/site/, a file this module copies, not
a module it imports): it loads the image's own kubetrain where the image has one (the trainer
image's `.pth` already did), else the copy in `lib/` beside it.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

BUNDLE_SITE = "site"
BUNDLE_LIB = "lib"
# The import closure (their own and their lazy imports, with the packages above them) of the
# torchrun hooks and of the runner of Client.train's functions (RUNNER_ROOTS).
RUNNER_ROOTS = ("kubetrain.trainer.torchrun_hooks", "kubetrain.trainer.function")
RUNTIME_MODULES = (
    "kubetrain.api",
    "kubetrain.api.contract",
    "kubetrain.api.function_call",
    "kubetrain.api.record_format",
    "kubetrain.trainer",
    "kubetrain.trainer.agent",
    "kubetrain.trainer.attempt_store",
    "kubetrain.trainer.dist",
    "kubetrain.trainer.ending",
    "kubetrain.trainer.function",
    "kubetrain.trainer.guest_records",
    "kubetrain.trainer.hf_adapter",
    "kubetrain.trainer.lightning_adapter",
    "kubetrain.trainer.metrics",
    "kubetrain.trainer.reach",
    "kubetrain.trainer.step_watch",
    "kubetrain.trainer.stopping",
    "kubetrain.trainer.survivor",
    "kubetrain.trainer.torch_private",
    "kubetrain.trainer.torchrun_hooks",
    "kubetrain.trainer.warmstart",
    "kubetrain.trainer.watchdog",
)
# The folder holding api/, local/ and trainer/: an installed wheel's kubetrain/, or the repository.
_KUBETRAIN = Path(__file__).resolve().parents[1]
# The loader, for the front of PYTHONPATH (kubetrain.local.localize.SITE_DIR's).
LOADER = _KUBETRAIN / "local" / "site" / "sitecustomize.py"


def relative_path(module: str) -> Path:
    """Where `module` (a RUNTIME_MODULES name) lives, relative to the folder holding `kubetrain`."""
    parts = module.split(".")
    return Path(*parts, "__init__.py") if len(parts) == 2 else Path(*parts[:-1], parts[-1] + ".py")


def install(into: Path) -> list[Path]:
    """Writes the runtime under `into` (`site/sitecustomize.py`, `lib/kubetrain/...`), readable by
    any user: the training container may run as another user than the init container did. `into`
    itself is left as it is (a volume's root, which this user may not own)."""
    written = [_copy(LOADER, into / BUNDLE_SITE / "sitecustomize.py")]
    for module in RUNTIME_MODULES:
        relative = relative_path(module)
        written.append(_copy(_KUBETRAIN.joinpath(*relative.parts[1:]), into / BUNDLE_LIB / relative))
    for path in into.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return written


def _copy(source_file: Path, target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source_file, target)
    return target


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m kubetrain.trainer.runtime_bundle DIRECTORY", file=sys.stderr)
        return 2
    into = Path(args[0])
    written = install(into)
    print(f"kubetrain runtime: {len(written)} files in {into}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
