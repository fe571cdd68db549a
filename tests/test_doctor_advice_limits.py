"""Doctor's advice never asks to lower a setting already at its limit: new-user trial, `rlctl doctor qslora` (LoRA
quickstart, algorithm.kl_coef = 0.0) advised "raise optim.lr, lower algorithm.kl_coef, ...". Sizes (checkpoints in
`ckpt list`, `status`) are printed with a unit that shows them: a 1.1 MB LoRA checkpoint read "0.00 GB"."""

from __future__ import annotations

import json
import shutil

from rlctl.runs.doctor import Finding, _advise, recipe_knobs
from tests.conftest import RECIPES


def test_no_advice_to_lower_a_value_already_at_zero(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(RECIPES / "quickstart", run / "quickstart")
    (run / "recipe.toml").write_text((RECIPES / "quickstart.toml").read_text())
    (run / "state.json").write_text(json.dumps({"backend": "trl", "status": "finished"}))
    knobs = recipe_knobs(run)
    assert knobs is not None
    f = _advise(Finding("flat_learning", "warn", "flat", [("optim.lr", "raise optim.lr"),
                                                          ("algorithm.kl_coef", "lower algorithm.kl_coef")]), knobs)
    assert f.action == "raise optim.lr" and f.evidence["advice_at_limit"] == ["algorithm.kl_coef = 0.0"], f


def test_sizes_below_a_gigabyte_show_their_unit():
    from rlctl.core.sizes import human_bytes

    assert human_bytes(1.1e6) == "1.1 MB" and human_bytes(47e9) == "47.0 GB" and human_bytes(300) == "300 B"


def test_ckpt_list_and_status_show_a_small_checkpoint_in_mb(tmp_path, cli):
    from tests.test_doctor_weights_pairs import checkpoint, run_with

    run = run_with(tmp_path)
    d = checkpoint(run, "checkpoint-10", [0.0])
    (d / "adapter_model.safetensors").write_bytes(b"\0" * 1_100_000)
    out = cli("ckpt", "list", str(run), cwd=tmp_path).out
    assert "1.1 MB" in out and "0.00 GB" not in out, out
    out = cli("status", str(run), cwd=tmp_path).out
    assert "0.00 GB" not in out and "MB)" in out, out
