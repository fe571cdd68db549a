"""OpenRLHF's checkpoints while they are written, and restarts after a kill at each point of a save.

On 2 x H100 (OpenRLHF 0.10.4, evidence openrlhf-c.json): `ckpt list` said step 2 complete, half a second later
incomplete (the DeepSpeed state and `latest` were there, the HF export just begun), later complete again; and after a
SIGKILL mid-export of step 4 rlctl restarted "from global_step2_hf, from_step 2" while --load_checkpoint loaded
DeepSpeed's `_actor/latest` = global_step4: the attempt record, the stream's step floor and the backend disagreed.

Here the release's own save code writes the real layout in its own order (ppo_actor.save_checkpoint ->
save_ckpt -> DeepSpeed's save_checkpoint and its `latest`, from the DeepSpeed release the wheel pins -> the HF
export in save_model's order; tests/conformance/_openrlhf_saves.py), a kill is a stop before any one of its writes,
and what the backend resumes from is DeepSpeed's own load_checkpoint reading what is on disk.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from rlctl.recipe.planning import prepare
from rlctl.runs.checkpoints import find_checkpoints, restart_point
from tests.conformance import test_openrlhf
from tests.conformance._openrlhf_saves import Saves
from tests.conformance._openrlhf_support import OpenRLHF
from tests.conformance.test_openrlhf import BACKEND, BASE, entry
from tests.conftest import ROOT

files = test_openrlhf.files  # its fixture: the data and reward files the recipe names

VERSION = "0.10.4"  # the GPU run's
# before each write of one save, in OpenRLHF 0.10.4's order; a kill before write K leaves the first K - 1
WRITES = ["model states", "optimizer states", "latest", "metric", "hf dir", "weights", "config", "tokenizer"]


class Killed(Exception):
    pass


def recipe(files: dict, run: Path, version: str = VERSION) -> Path:
    """The conformance recipe, saving every 2 steps with DeepSpeed states, keep_last 2, into the run's `checkpoints`
    (absolute: OpenRLHF writes a relative --ckpt_path under its working directory)."""
    text = BASE.format(version=version, data=files["data"], reward=files["reward"], ckpt=run / "checkpoints")
    # every 4 optimizer steps = every 2 global steps (rollouts of 8 prompts x 4 / 16 per optimizer step): --save_steps 2
    text = text.replace("every = 5", "every = 4").replace("save_optimizer = false", "save_optimizer = true")
    (run / "recipe.toml").write_text(text)
    return run / "recipe.toml"


def parsed(files: dict, run: Path, version: str = VERSION) -> Any:
    prep = prepare(recipe(files, run, version))
    with OpenRLHF(version) as o:
        args, _, _ = o.parse(entry(prep))
    return args


def listed(run: Path) -> dict[int, bool]:
    return {c.step: c.complete for c in find_checkpoints("openrlhf", run)}


@pytest.mark.parametrize("version", ["0.9.3", VERSION, "0.11.2"])
@pytest.mark.parametrize("hf", [True, False])
def test_ckpt_list_never_calls_a_checkpoint_complete_before_its_hf_export(version, hf, files, tmp_path):
    """Looked at before every write of three saves and after each: a step is complete only once its HF export is
    whole; a run that exports none counts its DeepSpeed state alone, from `latest` on. Nothing complete turns
    incomplete (a DeepSpeed state rotated away leaves the HF export, still complete)."""
    run = tmp_path / "run"
    run.mkdir()
    args = parsed(files, run, version)
    if hf:
        BACKEND.mark_checkpoint_root(run / "checkpoints")  # the supervisor does, before each attempt (test below)
    history: dict[int, list[bool]] = {}
    looks: list[tuple[str, dict[int, bool]]] = []

    def event(what: str) -> None:
        looks.append((what, listed(run)))

    with Saves(version, args, event, hf=hf) as s:
        for step in (2, 4, 6):
            looks.clear()
            s.save(step)
            event("after the save")
            names = [w for w, _ in looks]
            # the first look that may call it complete: after the export's last write, or after `latest`
            first = len(looks) - 1 if hf else names.index("latest") + 1
            assert [seen.get(step, False) for _, seen in looks] == [i >= first for i in range(len(looks))], \
                (step, looks)
            for _, seen in looks:
                for k, done in seen.items():
                    history.setdefault(k, []).append(done)
    for step, done in history.items():
        assert done == sorted(done), f"step {step} went complete -> incomplete: {done}"


@pytest.mark.parametrize("kill", range(1, len(WRITES) + 2))
def test_restart_after_a_kill_records_the_checkpoint_deepspeed_loads(kill, files, tmp_path):
    """Kill before each write of step 4's save (and after all of it): the restart point is the newest complete
    checkpoint, and DeepSpeed's own load_checkpoint then loads exactly that one; the redone save completes."""
    run = tmp_path / "run"
    run.mkdir()
    args = parsed(files, run)
    BACKEND.mark_checkpoint_root(run / "checkpoints")
    writes = {"n": 0, "armed": False}

    def event(what: str) -> None:
        if writes["armed"]:
            writes["n"] += 1
            if writes["n"] == kill:
                raise Killed(what)

    with Saves(VERSION, args, event) as s:
        s.save(2)
        writes["armed"] = True
        with contextlib.suppress(Killed):
            s.save(4)
        writes["armed"] = False
        assert writes["n"] == min(kill, len(WRITES)), "the save's writes are not the ones listed"
        ckpt, changes = restart_point("openrlhf", run)
        want = 4 if kill > len(WRITES) else 2
        assert ckpt is not None and ckpt.step == want, (ckpt, changes)
        assert s.loads(run / "checkpoints") == want  # what --load_checkpoint loads now
        assert listed(run)[want] is True and max(listed(run)) == want  # nothing half-written left beside it
        said = {"latest": "_actor/latest: global_step4 -> global_step2",  # rlctl pointed it back
                "state": "_actor/global_step4 removed (newer than the checkpoint resumed from)",
                "export": "global_step4_hf removed (an incomplete export newer than the checkpoint resumed from)"}
        expected = [] if want == 4 else [said["latest"]] * (kill > 3) + [said["state"]] + [said["export"]] * (kill > 5)
        assert changes == expected, changes
        for step in range(want + 2, 8, 2):  # the new attempt saves again from there
            s.save(step)
    assert listed(run) == {2: True, 4: True, 6: True}  # OpenRLHF keeps every HF export (rlctl prunes, not here)


@pytest.mark.parametrize("kill", [4, 6])  # the first save: `latest` written (no export anywhere yet); mid-export
def test_restart_in_the_first_save_starts_afresh(kill, files, tmp_path):
    """No checkpoint is complete yet: the restart is from the start, and the backend must not load the DeepSpeed state
    of step 2 either (its export would never be written): rlctl's mark says exports are due before the first one."""
    run = tmp_path / "run"
    run.mkdir()
    args = parsed(files, run)
    BACKEND.mark_checkpoint_root(run / "checkpoints")
    writes = {"n": 0}

    def event(what: str) -> None:
        writes["n"] += 1
        if writes["n"] == kill:
            raise Killed(what)

    with Saves(VERSION, args, event) as s:
        with contextlib.suppress(Killed):
            s.save(2)
        assert listed(run) == {2: False}
        ckpt, changes = restart_point("openrlhf", run)
        assert ckpt is None and s.loads(run / "checkpoints") is None, changes
        assert "_actor/latest (global_step2) removed: the restart starts afresh" in changes
        assert listed(run) == {}


# ---------------------------------------------------------------------------------------------------------------
# the same through rlctl's supervisor: a trainer that runs the release's code and is SIGKILLed mid-save


def _executor(record: Path) -> Any:
    from rlctl.executors.local import LocalExecutor

    class Here(LocalExecutor):
        """The local executor; a restart runs the stand-in trainer with the arguments rlctl rendered for it."""

        def command(self, plan: Any, backend: Any, spec: dict[str, Any]) -> list[str]:
            return trainer(record, BACKEND.entrypoint(plan)[3:])

    return Here()


def trainer(record: Path, rendered: list[str], *kill: str) -> list[str]:
    return [sys.executable, "-m", "tests.conformance._openrlhf_saves", "--version", VERSION, "--steps", "6",
            "--record", str(record), *kill, "--", *rendered]


@pytest.mark.parametrize("kill", [4, 7])  # `latest` written, export not begun; mid-export (the GPU run's)
def test_supervisor_restart_resumes_where_the_backend_does_every_step_once(kill, files, tmp_path):
    from rlctl.runs.rundir import create_run_dir
    from rlctl.runs.state import read_state
    from rlctl.runs.supervisor import Supervisor

    run = create_run_dir(tmp_path / "runs", "orl")
    prep = prepare(recipe(files, run))
    record = tmp_path / "loaded.jsonl"
    spec = {"argv": trainer(record, entry(prep), "--kill-at", str(kill), "--kill-step", "4"),
            "backend": "openrlhf", "grace_seconds": 5, "restart": {"mode": "on-failure", "max_restarts": 1},
            "keep_last": 2, "checkpoint_dir": str(run / "checkpoints"), "prune_during_run": True, "checkpoint_every": 2}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    assert Supervisor(run, spec, env, executor=_executor(record)).run() == 0
    a1, a2 = read_state(run)["attempts"]
    loads = [json.loads(line) for line in record.read_text().splitlines()]
    assert [x["load"] for x in loads] == [False, True]
    assert a1["exit_code"] < 0 and a2["restart"]
    # the record says the checkpoint the backend loaded, and it is the newest complete one (step 4's was half-written)
    assert a2["from_step"] == loads[1]["loaded"] == 2, (a2, loads)
    assert a2["from_checkpoint"] == str(run / "checkpoints" / "global_step2_hf")
    assert any("_actor/latest: global_step4 -> global_step2" in c for c in a2["resume_changes"]), a2
    assert "restarting from checkpoint step 2 (so that the backend loads it" in (run / "stdout.log").read_text()
    # one stream: every step once; the floor is the last step streamed before the restart
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert sorted(steps) == list(range(1, 7)) and max(Counter(steps).values()) == 1, steps
    assert (run / ".step_floor").read_text().strip() == "4"
    assert listed(run) == {4: True, 6: True}  # keep_last 2, each whole: step 4 written again
    assert json.loads((run / "checkpoints" / ".rlctl-openrlhf.json").read_text()) == {"hf_exports": True}


def test_launch_resume_from_the_best_checkpoint_loads_that_one(files, tmp_path):
    """`rlctl launch --resume RUN` after a stop_when rule stopped RUN starts from its best-marked checkpoint. The copy
    needs a `latest` that names it: the parent's names its newest (so it is not copied), and without one DeepSpeed
    loads nothing: the new run trained from the base model while its record said step 4."""
    from rlctl.backends import get_backend
    from rlctl.core.state import write_state
    from rlctl.runs.launch import _parent_checkpoint, point_staged, stage_checkpoint

    parent = tmp_path / "parent-20261127-000000"
    parent.mkdir()
    args = parsed(files, parent)
    BACKEND.mark_checkpoint_root(parent / "checkpoints")
    with Saves(VERSION, args) as s:
        for step in (2, 4, 6):
            s.save(step)
        write_state(parent, backend="openrlhf", status="stopped", stopped_by={"rule": "eval_divergence"},
                    best_checkpoint={"step": 4, "key": "eval/default/greedy_pass@1", "value": 0.9})
        ckpt = _parent_checkpoint(get_backend("openrlhf"), parent)
        assert ckpt.step == 4
        child = tmp_path / "child" / "checkpoints"
        stage_checkpoint(ckpt, parent / "checkpoints", child)
        assert s.loads(child) is None  # the copy alone: DeepSpeed finds no `latest`, OpenRLHF starts afresh
        assert point_staged(BACKEND, child, 4) == ["_actor/latest: (none) -> global_step4"]
        assert s.loads(child) == 4
        assert [(c.step, c.complete) for c in BACKEND.checkpoints(child)] == [(4, True)]
        assert (parent / "checkpoints" / "_actor" / "latest").read_text() == "global_step6"  # the parent as it was


@pytest.mark.parametrize("keep", [1, 2])
@pytest.mark.parametrize("kill", [1, 3])  # step 4's save: before its model states (its rotation done); before `latest`
def test_keep_last_1_leaves_no_complete_checkpoint_during_a_save(keep, kill, files, tmp_path):
    """OpenRLHF's save_ckpt rotates *before* it saves: with --max_ckpt_num 1 it deletes step 2's DeepSpeed state, then
    writes step 4's; killed in between, nothing is left to resume from (the restart starts afresh, every step lost).
    With 2 step 2 stays whole. What preflight's run.keep_last says (Backend.min_keep_last) is what happens."""
    run = tmp_path / "run"
    run.mkdir()
    recipe(files, run)
    (run / "recipe.toml").write_text((run / "recipe.toml").read_text().replace("keep_last = 2", f"keep_last = {keep}"))
    prep = prepare(run / "recipe.toml")
    with OpenRLHF(VERSION) as o:
        args, _, _ = o.parse(entry(prep))
    BACKEND.mark_checkpoint_root(run / "checkpoints")
    floor = BACKEND.min_keep_last(prep.recipe)
    assert floor is not None and floor[0] == 2
    writes = {"n": 0, "armed": False}

    def event(what: str) -> None:
        if writes["armed"]:
            writes["n"] += 1
            if writes["n"] == kill:
                raise Killed(what)

    with Saves(VERSION, args, event) as s:
        s.save(2)
        assert listed(run) == {2: True}
        writes["armed"] = True
        with contextlib.suppress(Killed):
            s.save(4)
        ckpt, _ = restart_point("openrlhf", run)
        if keep < floor[0]:
            assert ckpt is None and s.loads(run / "checkpoints") is None, listed(run)
        else:
            assert ckpt is not None and ckpt.step == 2 and s.loads(run / "checkpoints") == 2, listed(run)
