"""Executors: where a run's process tree lives (a local process group or a Ray job)."""
