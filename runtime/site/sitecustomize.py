"""kubetrain's runtime loader, first on PYTHONPATH: for every node process of `kubetrain run
--local` (local/localize.py), and in a pod whose image may lack kubetrain (the operator's init
container copies it to /kubetrain-runtime/site: kubetrain.runtime.bundle). The trainer image's
`kubetrain-torchrun-hooks.pth` has loaded the hooks before this runs.

It loads kubetrain.runtime.torchrun_hooks (inert until torch.distributed is imported): the
Python's own kubetrain where it has one, else the bundled copy in `../lib`, appended to sys.path
so that it never shadows anything the image installed. Then it runs the sitecustomize this Python
would have run without it, if there is one. Standard library only, Python 3.10 and later.
"""

import importlib.machinery
import importlib.util
import os
import sys

_HOOKS = "kubetrain.runtime.torchrun_hooks"
_here = os.path.dirname(os.path.abspath(__file__))


def _load_runtime() -> None:
    if _HOOKS in sys.modules:  # the image's .pth loaded them
        return
    try:
        own = importlib.util.find_spec(_HOOKS) is not None
    except ImportError:  # no kubetrain in this Python
        own = False
    if not own:
        bundled = os.path.join(os.path.dirname(_here), "lib")
        if not os.path.isdir(bundled):  # a local node running another Python, without kubetrain
            return
        sys.path.append(bundled)
    try:
        importlib.import_module(_HOOKS)
    except Exception as error:  # never break the user's interpreter; say why the runtime is missing
        print(f"kubetrain: runtime not loaded ({type(error).__name__}: {error})", file=sys.stderr)


_load_runtime()

_spec = importlib.machinery.PathFinder.find_spec(
    "sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != _here]
)
if _spec is not None and _spec.loader is not None:
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
