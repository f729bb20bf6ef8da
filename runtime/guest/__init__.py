"""What runs in a user's own worker, in any image: the step watch, the framework adapters, the
per-attempt store prefix, the records of a script that reports none, and the runner of shipped functions."""
