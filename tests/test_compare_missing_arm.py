"""compare's test line where an arm has no finished run: it says so, not that the seeds differ (the hostile trial:
both arms used seed 42, B's run was lost, and compare said "the arms do not share the same seeds")."""

from __future__ import annotations

from rlctl.experiments.report import ArmResult, RunValue, _pairable


def test_an_arm_without_finished_runs_is_named_not_called_a_seed_mismatch():
    arms = [{"id": "A", "diff": {}}, {"id": "B", "diff": {"optim.lr": [1e-6, 2e-6]}}]
    a = ArmResult("A", "a.toml", [RunValue("e-A-s42", 42, 0.5, 5, [])])
    b = ArmResult("B", "b.toml", [])
    ok, why = _pairable(arms, [a, b])
    assert not ok
    assert why == "none: arm B has no finished runs (a paired or Welch's test needs runs in both arms)", why
    assert "seeds" not in why
