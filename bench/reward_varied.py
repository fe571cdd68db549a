"""A reward with spread for randomly initialised models (whose text decodes to almost nothing): a deterministic
function of the completion's token ids, so every group has non-zero advantages and every step a real gradient."""


def reward_func(completions, completion_ids=None, **kwargs):
    if completion_ids is None:
        return [(len(str(c)) % 7) / 6 for c in completions]
    return [(sum(ids) % 101) / 100 for ids in completion_ids]
