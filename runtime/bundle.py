"""kubetrain's runtime as files, for images that lack kubetrain.

The runtime is this package, `kubetrain.runtime`: everything that runs beside user code (the
torchrun hooks, the in-place agent, the stop vote, the hang watchdog, the records, the framework
adapters and the runner of the functions Client.train ships), with the few modules of
`kubetrain.api` it reads (the env contract, the record format, the function call: standard library
only). It needs only the standard library and the torch it finds, on Python 3.10 and later
(tests/trainer/test_runtime_bundle.py checks both), so it runs in any image with torch.

The operator gives every training pod an init container of kubetrain's operator image that runs

    python -m kubetrain.runtime.bundle /kubetrain-runtime

into an emptyDir, and the training container `PYTHONPATH=/kubetrain-runtime/site`
(operator/render.py, docs/images.md). That folder holds one file, the `sitecustomize` that
`kubetrain run --local` puts first on PYTHONPATH too (runtime/site/, a file this module copies, not
a module it imports): it loads the image's own kubetrain where the image has one (the trainer
image's `.pth` already did), else the copy in `lib/` beside it.

What is copied is read from the folder, never listed by hand: every module of this package, and the
`kubetrain.api` modules they import (at any depth, function bodies included).
"""

from __future__ import annotations

import ast
import shutil
import sys
from pathlib import Path

BUNDLE_SITE = "site"
BUNDLE_LIB = "lib"
_RUNTIME = Path(__file__).resolve().parent
# The folder holding api/ and runtime/: an installed wheel's kubetrain/, or the repository.
_KUBETRAIN = _RUNTIME.parent
# The loader, for the front of PYTHONPATH (kubetrain.local.localize's SITE_DIR too).
LOADER = _RUNTIME / "site" / "sitecustomize.py"
SITE_DIR = LOADER.parent


def module_name(path: Path) -> str:
    """`kubetrain.runtime.worker.dist` for <kubetrain>/runtime/worker/dist.py."""
    parts = path.relative_to(_KUBETRAIN).with_suffix("").parts
    return ".".join(("kubetrain", *(parts[:-1] if parts[-1] == "__init__" else parts)))


def module_file(module: str) -> Path | None:
    """The file of a kubetrain module (a package's `__init__.py`), None for any other name."""
    parts = module.split(".")
    if parts[0] != "kubetrain" or len(parts) < 2:
        return None
    base = _KUBETRAIN.joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imported(path: Path) -> set[str]:
    """Every name `path` imports, at any level of the file (function bodies included)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return names


def files() -> list[Path]:
    """The runtime's modules and the kubetrain modules they import, with the packages above them
    (not `kubetrain` itself: a namespace package)."""
    found = {p for p in _RUNTIME.rglob("*.py") if p.parent.name != BUNDLE_SITE and "__pycache__" not in p.parts}
    todo = sorted(found)
    while todo:
        for name in imported(todo.pop()):
            path = module_file(name)
            if path is None or path in found:
                continue
            found.add(path)
            todo.append(path)
            package = path.parent
            while package != _KUBETRAIN and (package / "__init__.py") not in found:
                found.add(package / "__init__.py")
                todo.append(package / "__init__.py")
                package = package.parent
    return sorted(found)


def install(into: Path) -> list[Path]:
    """Writes the runtime under `into` (`site/sitecustomize.py`, `lib/kubetrain/...`), readable by
    any user: the training container may run as another user than the init container did. `into`
    itself is left as it is (a volume's root, which this user may not own)."""
    written = [_copy(LOADER, into / BUNDLE_SITE / LOADER.name)]
    for path in files():
        written.append(_copy(path, into / BUNDLE_LIB / "kubetrain" / path.relative_to(_KUBETRAIN)))
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
        print("usage: python -m kubetrain.runtime.bundle DIRECTORY", file=sys.stderr)
        return 2
    into = Path(args[0])
    written = install(into)
    print(f"kubetrain runtime: {len(written)} files in {into}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
