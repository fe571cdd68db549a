"""rlctl: a control plane for RL fine-tuning of LLMs."""

__version__ = "0.1.0"
