"""Held-out evaluation (docs/eval.md): named eval sets and their modes, the checkpoint evaluator (rlctl's own or a
command template), the step-0 baseline, and the run's best checkpoint by the primary eval.

Nothing here imports torch, transformers or vLLM at import time: only the eval job itself (`python -m
rlctl.evals.job`, its own process) does.
"""
