"""OpenRLHF's step accounting, as its trainer does it (read in every release 0.9.3-0.11.2, same in all):

- `trainer/ppo_trainer.py` prepare_datasets(): the scheduler's horizon
  `max_steps = len(prompts) * n_samples_per_prompt // train_batch_size * num_episodes * max_epochs`
  (len(prompts) after `--max_samples`), and warmup `ceil(max_steps * lr_warmup_ratio)` (ppo_actor.py / deepspeed.py).
- PPOTrainer.fit(): one `global_step` per rollout of `rollout_batch_size` prompts; a last partial batch of an
  episode is dropped (`_collect_prompt_batch` reports the loader exhausted), so an episode has
  len(prompts) // rollout_batch_size rollouts.
- the actor trains `max_epochs` passes over each rollout's `rollout_batch_size * n_samples_per_prompt` samples,
  DeepSpeed stepping the optimizer (and the scheduler) once per `train_batch_size` samples.

So the log's step (global_step) is a rollout, and one rollout is rollout_batch_size * n * max_epochs /
train_batch_size optimizer steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlctl.recipe.schema import Recipe

DEFAULT_WARMUP_RATIO = 0.03  # --lr_warmup_ratio's default in every release


@dataclass
class Steps:
    episodes: int
    max_samples: int | None  # --max_samples to render (None: the whole dataset)
    prompts: int | None  # len(prompts) as the trainer sees it
    horizon: int | None  # the scheduler's num_training_steps (max_steps)
    total: int | None  # optimizer steps that really run
    rollouts: int | None  # global_steps (what the log counts)
    per_rollout: float  # optimizer steps per global_step
    problems: list[tuple[str, str, str]] = field(default_factory=list)  # (level, key, message)


def per_rollout(recipe: Recipe) -> float:
    r = recipe
    return r.rollout.prompts_per_step * r.rollout.group_size * r.train.epochs_per_rollout / r.train.train_batch_size


def horizon(prompts: int, recipe: Recipe, episodes: int) -> int:
    r = recipe
    return prompts * r.rollout.group_size // r.train.train_batch_size * episodes * r.train.epochs_per_rollout


def real_steps(prompts: int, recipe: Recipe, episodes: int) -> tuple[int, int]:
    """(optimizer steps, rollouts) that really run over `episodes` passes of `prompts` prompts."""
    r = recipe
    rollouts = prompts // r.rollout.prompts_per_step * episodes
    samples = rollouts * r.rollout.prompts_per_step * r.rollout.group_size * r.train.epochs_per_rollout
    return samples // r.train.train_batch_size, rollouts


def plan_steps(recipe: Recipe, dataset_size: int | None) -> Steps:
    r = recipe
    spr = per_rollout(r)
    if r.train.steps is None:
        episodes = r.train.episodes or 1
        if dataset_size is None:
            return Steps(episodes, None, None, None, None, None, spr)
        total, rollouts = real_steps(dataset_size, r, episodes)
        return Steps(episodes, None, dataset_size, horizon(dataset_size, r, episodes), total, rollouts, spr)
    want = r.train.steps
    if dataset_size is None:
        return Steps(1, None, None, None, None, None, spr, [(
            "error", "train.steps",
            f"train.steps = {want} cannot be rendered for OpenRLHF without the dataset size: it has no step limit, "
            "only episodes over the prompt set (point data.train at a local file, or use train.episodes)")])
    per_episode_max = dataset_size // r.rollout.prompts_per_step
    if per_episode_max == 0:
        return Steps(1, None, dataset_size, 0, 0, 0, spr, [(
            "error", "train.steps", f"the dataset ({dataset_size} prompts) is smaller than one rollout "
            f"(rollout.prompts_per_step = {r.rollout.prompts_per_step})")])
    # rollouts needed; an episode of k rollouts over the first k * prompts_per_step prompts (--max_samples)
    rollouts_needed = want / spr
    best: tuple[int, int] | None = None
    if abs(rollouts_needed - round(rollouts_needed)) < 1e-9:
        need = round(rollouts_needed)
        for episodes in range(max(1, math.ceil(need / per_episode_max)), need + 1):
            if need % episodes == 0 and need // episodes <= per_episode_max:
                best = (episodes, need // episodes)
                break
    problems = []
    if best is None:
        episodes = max(1, math.ceil(rollouts_needed / per_episode_max))
        k = min(per_episode_max, max(1, round(rollouts_needed / episodes)))
        best = (episodes, k)
    episodes, k = best
    prompts = k * r.rollout.prompts_per_step
    max_samples = None if prompts == dataset_size else prompts
    total, rollouts = real_steps(prompts, r, episodes)
    if total != want:
        problems.append(("warn", "train.steps",
                         f"train.steps = {want} cannot be met exactly with OpenRLHF: a rollout is {spr:g} optimizer "
                         f"steps and an episode at most {per_episode_max} rollouts; the run takes {total}"))
    return Steps(episodes, max_samples, prompts, horizon(prompts, r, episodes), total, rollouts, spr, problems)


def warmup_ratio_for(steps: int, horizon_steps: int) -> float:
    """A --lr_warmup_ratio whose `math.ceil(max_steps * ratio)` (OpenRLHF's formula, in floats) is exactly `steps`."""
    if steps <= 0:
        return 0.0
    ratio = float(repr((steps - 0.5) / horizon_steps))
    assert math.ceil(horizon_steps * ratio) == steps
    return ratio
