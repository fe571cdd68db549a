"""`ckpt push` / an eval relay makes a run record on the host for the checkpoints it sends (ssh_remote's `adopt`
verb, run there by the host's rlctl). A run of the same name already there is never written into."""

from __future__ import annotations

import json

import pytest

from rlctl.core.state import read_state, write_state
from rlctl.errors import RlctlError
from rlctl.executors.ssh_remote import adopt_checkpoint


def test_a_run_of_the_same_name_on_the_host_is_not_overwritten(tmp_path, monkeypatch):
    """The host trained its own `a26-20261127-010203` (or another laptop pushed one of that name): the push
    rewrote its recipe.toml and state.json as a finished pushed record and mixed checkpoints into it. Refused, naming
    the directory and the fix; a second push of the same source goes on."""
    monkeypatch.chdir(tmp_path)
    for k in [k for k in __import__("os").environ if k.startswith("RLCTL_")]:
        monkeypatch.delenv(k)
    mine = tmp_path / "runs" / "a26-20261127-010203"
    (mine / "checkpoints").mkdir(parents=True)
    (mine / "recipe.toml").write_text('[train]\nsteps = 220\n')
    write_state(mine, name=mine.name, status="running", backend="trl", executor="local")
    req = {"name": mine.name, "backend": "trl", "files": [], "source": "box1:a26-20261127-010203"}
    with pytest.raises(RlctlError) as e:
        adopt_checkpoint({**req, "check": True})
    assert str(mine) in e.value.message and "a run of its own" in e.value.message and "move or remove" in e.value.hint
    assert read_state(mine)["status"] == "running" and "steps = 220" in (mine / "recipe.toml").read_text()

    other = {**req, "name": "b-20261127-000000"}
    (tmp_path / "runs" / other["name"] / "checkpoints").mkdir(parents=True)  # as the push's rsync leaves it
    assert adopt_checkpoint(other)["run_dir"].endswith("b-20261127-000000")
    assert adopt_checkpoint({**other, "check": True})["adopted"] is True  # the same source again: it goes on
    with pytest.raises(RlctlError, match="pushed from box1"):
        adopt_checkpoint({**other, "source": "box2:b-20261127-000000"})
    assert json.loads((tmp_path / "runs" / "b-20261127-000000" / "state.json").read_text())["pushed_from"] == \
        "box1:a26-20261127-010203"


def test_a_host_python_that_is_not_there_is_said_with_the_fix():
    """`hosts check` with --python naming a venv not made yet printed bash's "No such file or directory" as
    "rlctl facts failed" with no fix. The shell's own message (run here for real) becomes a clear error."""
    import subprocess

    from rlctl.core.host import Host
    from rlctl.executors.ssh_runner import remote_rlctl_error

    py = "/nonexistent-rlctl-test/venv/bin/python"
    p = subprocess.run(["bash", "-c", f"{py} -m rlctl facts --json"], capture_output=True, text=True)
    assert p.returncode != 0
    err = remote_rlctl_error(Host(name="box1", ssh="box1", python=py), p)
    assert err is not None and f"no {py} there" in err.message and "hosts install box1" in err.hint, (p.stderr, err)
