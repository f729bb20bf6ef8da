"""kubetrain's trainer: PyTorch DDP under torchrun's env contract.

Importing this package is cheap and needs neither torch nor kopf/kubernetes: the operator
imports `kubetrain.api.training` to share the training schema. The library API for
bring-your-own scripts lives in `kubetrain.trainer.lib`.
"""
