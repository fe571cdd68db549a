"""Where OpenRLHF's PPO clip range cannot act (Backend.inert), read from the command train_ppo_ray would parse.

Every release (0.9.3 - 0.11.2) trains a rollout right after the actor computes its old log-probs: train_step calls
experience_maker.make_experience_batch (actor forward) and then ppo_train, with --async_train / --train.async_enable
too (the training actor makes the experience of each rollout it takes off the queue). So the ratio
exp(log_probs - old_log_probs) in models/loss.py PolicyLoss moves only after an optimizer step taken inside the
training of that rollout: DeepSpeed steps every train_batch_size samples, counted across rollouts, and a rollout is
rollout_batch_size x n_samples_per_prompt samples trained max_epochs times. Where train_batch_size is a multiple of
that, no step falls inside a rollout: the ratio is exactly 1 at every update and neither the clip range
(eps_clip / eps_clip_low_high) nor the dual clip binds. GSPO with the vLLM importance-sampling correction takes the
ratio against the rollout's own log-probs instead (it moves); dynamic filtering and dynamic batching make the
counts data-dependent: no verdict there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlctl.backends.base import Inert

if TYPE_CHECKING:
    from rlctl.recipe.schema import Recipe

# flags rlctl does not render, (flat, dotted): the clip keys, and what changes where the ratio comes from
CLIP = {"eps_clip_low_high": ("--eps_clip_low_high", "--actor.eps_clip_low_high"),
        "dual_clip": ("--dual_clip", "--actor.dual_clip")}
OTHER = {"policy_loss_type": ("--policy_loss_type", "--actor.policy_loss_type"),
         "is_correction": ("--enable_vllm_is_correction", "--algo.advantage.is_correction_enable"),
         "is_correction_level": ("", "--algo.advantage.is_correction_level"),  # 0.11.x: off | token | seq
         "dynamic_filtering": ("--dynamic_filtering", "--algo.dynamic_filtering_enable"),
         "dynamic_batch": ("--use_dynamic_batch", "--train.dynamic_batch_enable")}


def inert(backend: Any, recipe: Recipe) -> list[Inert]:
    from rlctl.backends.openrlhf.argv import Refused, _dest, parse, resolve
    from rlctl.backends.openrlhf.releases import release

    version = backend.target_version(recipe)
    rel = release(version)
    known = {k: v for k, v in recipe.backend.extra().items() if resolve(version, k)}
    try:
        args = parse(version, backend.cli_args(recipe, extra=known)[0])
    except Refused:
        return []  # a command train_ppo_ray refuses: render says why

    def flag(pair: tuple[str, str]) -> str | None:
        name = pair[1] if rel.dotted else pair[0]
        return name if name and name in rel.flags else None

    def value(f: str | None, default: Any = None) -> Any:
        return getattr(args, _dest(f), default) if f else default

    out: dict[str, Inert] = {}
    clip = rel.flag("eps_clip")
    low_high = flag(CLIP["eps_clip_low_high"])
    for k in known:
        f = resolve(version, k)
        if f in (clip, low_high):  # train_ppo_ray clips at eps_clip_low_high; eps_clip only fills it when unset
            out["algorithm.eps_clip"] = Inert(
                "algorithm.eps_clip", f"backend.openrlhf.extra sets {f} = {known[k]}, which is the clip range "
                f"train_ppo_ray uses (the extra wins over {clip} rendered from algorithm.eps_clip)",
                f"remove {k} from backend.openrlhf.extra and set algorithm.eps_clip")
    names = {c: rel.flag(c) for c in ("train_batch_size", "rollout_batch_size", "n_samples_per_prompt", "max_epochs")}
    t, prompts, n, epochs = (value(f) for f in names.values())
    level = value(flag(OTHER["is_correction_level"]), "off")
    corrected = bool(value(flag(OTHER["is_correction"]), False)) or level not in ("off", None)
    if (value(flag(OTHER["policy_loss_type"]), "ppo") != "ppo" and corrected) or \
            value(flag(OTHER["dynamic_filtering"]), False) or value(flag(OTHER["dynamic_batch"]), False):
        return list(out.values())  # a ratio against the rollout's log-probs, or counts that depend on the data
    if not all(isinstance(x, int) and x > 0 for x in (t, prompts, n, epochs)):
        return list(out.values())
    used = prompts * n * epochs  # samples one rollout is trained on
    if t % used:
        return list(out.values())  # an optimizer step inside a rollout's training: the ratio moves there
    f_t, f_r, f_n, f_e = names.values()
    why = (f"{f_t} = {t}, {f_r} = {prompts} prompts x {f_n} = {n} x {f_e} = {epochs}: "
           + ("one optimizer step per rollout" if t == used else f"one optimizer step per {t // used} rollouts")
           + ", and the actor computes the old log-probs right before training on each rollout (train_step: "
           "make_experience_batch, then ppo_train; with async training too), so the ratio exp(log_probs - "
           f"old_log_probs) is exactly 1 at every update and clamp(ratio, 1 - eps_clip, 1 + eps_clip) never binds "
           f"(openrlhf {version} models/loss.py PolicyLoss)")
    more = next(e for e in range(2, t // (prompts * n) + 2) if t % (prompts * n * e))
    fix = (f"set train.epochs_per_rollout = {more} ({f_e} {more}: each rollout is trained on again after an optimizer "
           "step, where the ratio moves and the clip acts)"
           + (f", or train.train_batch_size = {prompts * n // 2} (two optimizer steps per rollout)"
              if epochs == 1 and t == used and prompts * n % 2 == 0 else ""))
    keys = ["algorithm.eps_clip"] + [f"backend.openrlhf.extra.{f.lstrip('-')}" for f in
                                     (low_high, flag(CLIP["dual_clip"]), clip) if f]
    for key in keys:
        out.setdefault(key, Inert(key, why, fix, {"train.epochs_per_rollout": more}))
    return list(out.values())
