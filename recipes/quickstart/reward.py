"""Quickstart reward: the fraction of 'a' characters in each completion (TRL reward-function signature)."""


def reward_func(completions, **kwargs):
    rewards = []
    for completion in completions:
        text = completion if isinstance(completion, str) else "".join(m.get("content", "") for m in completion)
        rewards.append(text.count("a") / len(text) if text else 0.0)
    return rewards
