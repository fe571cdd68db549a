"""OpenRLHF's checkpoints under --ckpt_path (the same in every release 0.9.3-0.11.2), and what its resume loads.

One save of step N (`ppo_actor.save_checkpoint`, 0.10.4 read; the critic's is the same under `_critic/`) writes, in
this order:
- `_actor/global_stepN/`: the DeepSpeed state, by `strategy.save_ckpt` (utils/deepspeed/deepspeed.py) through
  DeepSpeed's `save_checkpoint(save_dir, tag, save_latest=True)`, which writes the tag directory first, then
  `_actor/latest` (holding the tag); save_ckpt then writes a metric json into the tag directory. The DeepSpeed part is
  complete when `latest` names this step or a later one. `save_ckpt` deletes the oldest (by mtime) until fewer than
  --max_ckpt_num remain, before saving; from 0.9.9 `best_global_stepN` tags are kept apart (only the newest stays).
- `global_stepN_hf/`: the HF export (`os.path.join(ckpt_path, f"{tag}_hf")`), by `strategy.save_model`:
  os.makedirs, weights or adapter, `config.json`, then the tokenizer — complete once `tokenizer_config.json` is there.
  OpenRLHF never deletes these (nor `best_global_stepN_hf`), in any release.

A run that exports HF (rlctl always renders --save_hf_ckpt and says so in MARKER before each attempt; a root holding
any HF export says so too) has a checkpoint complete only once both parts are: between `latest` and the export's last
file the DeepSpeed part alone must not count, or `ckpt list` says complete, then incomplete while the export is
written (seen on 2 x H100), and a restart there records one step while the backend loads another. A root with no HF
export anywhere (a run started without --save_hf_ckpt) counts its DeepSpeed states alone.

Resuming (--load_checkpoint) is DeepSpeed's `load_checkpoint(_actor)` with no tag: it loads the tag `latest` names,
whatever rlctl chose (and asserts when that tag's files are gone); no `latest`, or no `_actor/`, starts afresh. So
before a restart rlctl makes `latest` name the checkpoint it restarts from (point_resume).

`best_*` checkpoints are not rlctl's to prune (its pattern skips them); rlctl renders `--best_metric_key none` when
it must hold keep_last.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from rlctl.backends.layout import Checkpoint, ordered, read_int, scan

PATTERN = re.compile(r"^global_step(\d+)(?:_hf)?$")
HF_DONE = "tokenizer_config.json"  # strategy.save_model writes the tokenizer last
# left in the checkpoint root by rlctl before each attempt it starts (mark_root): every checkpoint of this run has an
# HF export, so a DeepSpeed state without one is still being written — known before the first export begins
MARKER = ".rlctl-openrlhf.json"


def _complete(path: Path, step: int) -> bool:
    if path.name.endswith("_hf"):
        has_model = any((path / f).is_file() for f in ("adapter_config.json", "config.json"))
        return has_model and (path / HF_DONE).is_file()
    latest = read_int(path.parent / "latest")
    return latest is not None and latest >= step


def _bases(root: Path) -> list[Path]:
    """The DeepSpeed state folders (`_actor`, `_critic`) under root."""
    return [d for d in root.iterdir() if d.is_dir() and not d.is_symlink() and d.name.startswith("_")]


def exports_hf(root: Path) -> bool:
    """Whether this root's checkpoints each have an HF export: rlctl's mark, else any export already there."""
    try:
        if json.loads((root / MARKER).read_text()).get("hf_exports") is True:
            return True
    except (OSError, ValueError, AttributeError):
        pass
    try:
        return any(p.is_dir() and not p.is_symlink() and p.name.endswith("_hf") and PATTERN.match(p.name)
                   for p in root.iterdir())
    except OSError:
        return False


def find(root: Path) -> list[Checkpoint]:
    try:
        bases = [root, *_bases(root)]
    except OSError:
        return []
    found = scan(bases, PATTERN, _complete)
    if exports_hf(root):  # the DeepSpeed part alone is a checkpoint whose export has not begun yet
        for c in found.values():
            if not any(p.name.endswith("_hf") for p in c.paths()):
                c.complete = False
    # `_actor/latest` belongs to the checkpoint it names: resuming (DeepSpeed's load_checkpoint with no tag) reads it,
    # so a copy of that checkpoint (rlctl launch --resume) must take it along
    for base in bases[1:]:
        latest = base / "latest"
        step = read_int(latest)
        if step in found and latest.is_file() and not latest.is_symlink():
            found[step].extra_paths.append(latest)
    return ordered(found)


def _state_dirs(c: Checkpoint) -> list[Path]:
    return [p for p in c.paths() if p.is_dir() and p.parent.name.startswith("_") and not p.name.endswith("_hf")]


def resumable(root: Path, c: Checkpoint) -> bool:
    """Complete, with the DeepSpeed state of every model that has one (`_actor`, with ppo `_critic`): what
    --load_checkpoint loads (an HF export alone resumes nothing)."""
    try:
        need = {b.name for b in _bases(root)}
    except OSError:
        return False
    have = {p.parent.name for p in _state_dirs(c)}
    return c.complete and "_actor" in have and need <= have


def _tag(base: Path) -> str | None:
    try:
        return (base / "latest").read_text(errors="replace").strip()
    except OSError:
        return None


def loads(root: Path) -> Checkpoint | None:
    """The checkpoint OpenRLHF's --load_checkpoint loads from root as it is: the tag `_actor/latest` names, when that
    tag's state is there (DeepSpeed asserts on a tag whose files are gone: it loads nothing then). None: it starts
    afresh."""
    actor = root / "_actor"
    tag = _tag(actor) if actor.is_dir() else None
    m = PATTERN.match(tag or "")
    if m is None or tag is None or tag.endswith("_hf") or not (actor / tag).is_dir():
        return None
    step = int(m.group(1))
    return next((c for c in find(root) if c.step == step), None)


def point_resume(root: Path, ckpt: Checkpoint | None) -> list[str]:
    """Make --load_checkpoint load `ckpt` (None: start afresh), in root only: each `latest` names its tag (written
    atomically), or is removed; the regular DeepSpeed states newer than it are removed (the restart writes them again,
    and save_ckpt's rotation counts them: it would delete the state resumed from before the new save is whole), and
    so are the newer HF exports still incomplete. Returns what was changed, in words."""
    done: list[str] = []
    keep = ckpt.step if ckpt is not None else -1
    try:
        bases = _bases(root)
    except OSError:
        return done
    for base in bases:
        want = f"global_step{ckpt.step}" if ckpt is not None and (base / f"global_step{ckpt.step}").is_dir() else None
        was = _tag(base)
        latest = base / "latest"
        if latest.is_symlink():
            continue  # not OpenRLHF's: leave it
        if want is not None and was != want:
            tmp = base / f".latest.rlctl-{os.getpid()}"
            tmp.write_text(want)
            os.replace(tmp, latest)
            done.append(f"{base.name}/latest: {was or '(none)'} -> {want}")
        elif want is None and was is not None:
            latest.unlink()
            done.append(f"{base.name}/latest ({was}) removed: the restart starts afresh")
        for p in sorted(base.iterdir()):
            m = PATTERN.match(p.name)
            if m and int(m.group(1)) > keep and p.is_dir() and not p.is_symlink() and not p.name.endswith("_hf"):
                shutil.rmtree(p)
                done.append(f"{base.name}/{p.name} removed (newer than the checkpoint resumed from)")
    for c in find(root):
        for p in c.paths():
            if c.step > keep and p.parent == root and p.name.endswith("_hf") and not p.is_symlink() \
                    and not _complete(p, c.step):
                shutil.rmtree(p)
                done.append(f"{p.name} removed (an incomplete export newer than the checkpoint resumed from)")
    return done


def mark_root(root: Path) -> None:
    """Say in root that this run's checkpoints each have an HF export (rlctl renders --save_hf_ckpt), atomically."""
    try:
        if json.loads((root / MARKER).read_text()).get("hf_exports") is True:
            return
    except (OSError, ValueError, AttributeError):
        pass
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"{MARKER}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"hf_exports": True}) + "\n")
    os.replace(tmp, root / MARKER)
