"""What runs in torchrun's agent process: the in-place gang restart and the warm start of its workers."""
