"""What runs in any training worker: the process group, the stop vote, the survivor's save, the hang
watchdog and rank 0's metrics records."""
