"""Put first on PYTHONPATH by `kubetrain run --local` for every node process (local/localize.py):
the trainer image's `kubetrain-torchrun-hooks.pth` does the same in a pod. It loads
kubetrain.trainer.torchrun_hooks (inert until torch.distributed is imported), then runs the
sitecustomize this Python would have run without it, if there is one."""

import contextlib
import importlib.machinery
import importlib.util
import os
import sys

# A node command running another Python, without kubetrain, has nothing to hook.
with contextlib.suppress(ImportError):
    import kubetrain.trainer.torchrun_hooks  # noqa: F401

_here = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.machinery.PathFinder.find_spec(
    "sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != _here]
)
if _spec is not None and _spec.loader is not None:
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
