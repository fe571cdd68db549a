"""Runs: launching, run directories, state, status, logs, checkpoints and diagnosis."""
