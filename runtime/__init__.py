"""kubetrain's runtime: what runs beside user code, in any image with torch.

Each room names the process that runs it:

- `agent/`: torchrun's agent (the elastic agent process of every pod or local node): the in-place
  gang restart (`inplace`) and the warm start of its workers (`warmstart`).
- `worker/`: any training worker, the built-in trainer's and a user's script under
  `kubetrain.trainer.lib`: the process group (`dist`), the stop vote (`stopping`), the save on a
  dead peer (`survivor`), the hang watchdog, rank 0's metrics records (`metrics`).
- `guest/`: a user's own worker in any image, kubetrain installed or not: the optimizer-step
  watch, the Hugging Face and Lightning adapters, the per-attempt store prefix, the records a
  script that reports nothing gets, and the runner of Client.train's functions (`function`).
- here: what more than one of them shares: the torchrun hooks that load all of the above
  (`torchrun_hooks`), the wall around torch's private names
  (`torch_private`), the one writer of the records they print (`records`), the gang store's keys
  and the attempt a process runs as (`store`), the wait for node 0 (`reach`), the one exit
  (`ending`); and `bundle`, which
  the operator image's init container runs to copy this package into an image without kubetrain.
  `site/` holds the loader first on such a pod's PYTHONPATH.

The runtime imports only the standard library, the user's torch and kubetrain.api's
standard-library modules (tests/test_imports.py checks it): never pydantic, never kubetrain.trainer.
"""
