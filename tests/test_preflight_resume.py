"""`checkpoint.resume = N` names a step the run must have: preflight says so before a backend fails at start (TRL,
verl, prime-rl and the command backend stop with "no checkpoint of step N"). The backend's adapter lists the
checkpoints of the checkpoint directory (Backend.checkpoints); the check names the key, its file:line and the steps
there are. A user's recipe with the README's defaults (./runs, no RLCTL_* variable): the command backend with a
trainer of a few lines (tests/test_restart_start.py), no torch."""

from __future__ import annotations

import json

from tests.test_restart_start import TRAINER, recipe


def line_of(path, text: str) -> int:
    return next(i for i, x in enumerate(path.read_text().splitlines(), 1) if x.startswith(text))


def test_a_resume_step_the_run_does_not_have_fails_preflight_with_the_steps_there_are(user):
    work, rlctl = user
    (work / "prompts.jsonl").write_text('{"input": "a"}\n')
    (work / "train.py").write_text(TRAINER)
    # a new run's checkpoint directory (checkpoint.dir relative: inside the run directory) holds no checkpoint
    (work / "r.toml").write_text(recipe("2"))
    r = rlctl("preflight", "r.toml")
    assert r.returncode == 1, r.stdout + r.stderr
    row = next(x for x in r.stdout.splitlines() if "checkpoint.resume" in x and x.startswith("FAIL"))
    assert f"r.toml:{line_of(work / 'r.toml', 'resume =')}" in row and "no checkpoint" in row, r.stdout
    assert "none" in row and "Traceback" not in r.stderr, r.stdout
    assert "rlctl launch RECIPE --resume RUN" in r.stdout, r.stdout
    r = rlctl("launch", "r.toml")  # refused before a run directory is made (was: started, then the trainer died)
    assert r.returncode == 1 and "checkpoint.resume" in r.stdout + r.stderr, r.stdout + r.stderr
    assert not (work / "runs").exists() or not any((work / "runs").iterdir())

    # a run that saved steps 1-3; a recipe that resumes from its checkpoint directory (absolute: a shared one)
    (work / "first.toml").write_text(recipe('"off"').replace('"train.py"', json.dumps(str(work / "train.py"))))
    assert rlctl("launch", "first.toml").returncode == 0
    ck = next((work / "runs").iterdir()) / "ck"
    assert sorted(p.name for p in ck.glob("step_*")) == ["step_1", "step_2", "step_3"]
    (work / "s.toml").write_text(recipe("7").replace('dir = "ck"', f"dir = {json.dumps(str(ck))}"))
    r = rlctl("preflight", "s.toml", "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    (res,) = [x for x in json.loads(r.stdout)["results"] if x["check"] == "checkpoint.resume"]
    assert res["verdict"] == "fail" and f"s.toml:{line_of(work / 's.toml', 'resume =')}" in res["figure"], res
    assert "step 7" in res["figure"] and "1, 2, 3" in res["figure"] and str(ck) in res["figure"], res
    assert res["set"] == {"checkpoint.resume": 3}, res
    r = rlctl("preflight", "s.toml", "--set", "checkpoint.resume=3", "--json")
    (res,) = [x for x in json.loads(r.stdout)["results"] if x["check"] == "checkpoint.resume"]
    assert res["verdict"] == "ok" and "step 3" in res["figure"], res

    # launch --resume RUN copies the parent's checkpoint into the new run: nothing to refuse
    r = rlctl("launch", "first.toml", "--resume", ck.parent.name, "--set", "train.steps=4")
    assert r.returncode == 0, r.stdout + r.stderr

    # a directory that cannot be read: not checked, and said why
    ck.chmod(0)
    try:
        import os

        if os.access(ck, os.R_OK):  # root reads everything: nothing to show
            return
        r = rlctl("preflight", "s.toml", "--json")
        (res,) = [x for x in json.loads(r.stdout)["results"] if x["check"] == "checkpoint.resume"]
        assert res["verdict"] == "skip" and str(ck) in res["figure"], res
    finally:
        ck.chmod(0o755)


def test_a_backend_that_does_not_ask_for_the_step_is_not_failed(tmp_path):
    """OpenRLHF loads what `_actor/latest` names, whatever checkpoint.resume says (its unhonoured finding warns):
    nothing fails at start, so the check says nothing."""
    from rlctl import preflight as pf
    from rlctl.recipe.planning import prepare
    from tests.conformance.test_openrlhf import BASE

    (tmp_path / "prompts.jsonl").write_text('{"input": "a"}\n')
    (tmp_path / "o.toml").write_text(BASE.format(version="0.10.4", data=tmp_path / "prompts.jsonl",
                                                 reward=tmp_path / "r.py", ckpt=tmp_path / "ck"))
    assert pf.run(prepare(str(tmp_path / "o.toml"), ["checkpoint.resume=2"]), ["checkpoint"]) == []
