"""rlctl's statistics (pure Python) against scipy's own functions: t quantiles and intervals, Welch's and the paired
t-test (statistic, df, p, confidence interval), and power from the noncentral t (scipy.stats.nct)."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rlctl.experiments import stats as S

scipy_stats = pytest.importorskip("scipy.stats")

values = st.lists(st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, allow_infinity=False), min_size=2,
                  max_size=12)


def close(a: float, b: float, rel: float = 1e-7, abs_: float = 1e-9) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_)


def spread(xs: list[float]) -> bool:
    return S.sample_sd(xs) > 1e-6 * max(1.0, max(abs(x) for x in xs))


@pytest.mark.parametrize("df", [1, 2, 3, 4.5, 7, 30, 120, 1e4])
@pytest.mark.parametrize("q", [0.001, 0.025, 0.2, 0.5, 0.8, 0.9, 0.975, 0.995])
def test_t_quantiles_and_tails_match_scipy(df, q):
    assert close(S.t_ppf(q, df), scipy_stats.t.ppf(q, df), rel=1e-8)
    x = scipy_stats.t.ppf(q, df)
    assert close(S.t_sf(x, df), scipy_stats.t.sf(x, df), rel=1e-9, abs_=1e-14)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(values)
def test_t_interval_matches_scipy(xs):
    assume(spread(xs))
    iv = S.t_interval(xs)
    lo, hi = scipy_stats.t.interval(0.95, len(xs) - 1, loc=S.mean(xs), scale=scipy_stats.sem(xs))
    assert close(iv.low, lo, abs_=1e-7) and close(iv.high, hi, abs_=1e-7)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(values, values)
def test_welch_matches_scipy_ttest_ind(a, b):
    assume(spread(a) and spread(b))
    mine = S.welch(a, b)
    ref = scipy_stats.ttest_ind(b, a, equal_var=False)
    assert close(mine.t, ref.statistic, rel=1e-7, abs_=1e-9)
    assert close(mine.df, ref.df, rel=1e-9)
    assert close(mine.p, ref.pvalue, rel=1e-6, abs_=1e-12)
    ci = ref.confidence_interval(0.95)
    assert close(mine.low, ci.low, rel=1e-7, abs_=1e-7) and close(mine.high, ci.high, rel=1e-7, abs_=1e-7)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.floats(-1e3, 1e3), st.floats(-1e3, 1e3)), min_size=2, max_size=12))
def test_paired_matches_scipy_ttest_rel(pairs):
    a, b = [x for x, _ in pairs], [y for _, y in pairs]
    assume(spread([y - x for x, y in pairs]))
    mine = S.paired(a, b)
    ref = scipy_stats.ttest_rel(b, a)
    assert close(mine.t, ref.statistic, rel=1e-6, abs_=1e-9)
    assert mine.df == ref.df
    assert close(mine.p, ref.pvalue, rel=1e-6, abs_=1e-12)
    ci = ref.confidence_interval(0.95)
    assert close(mine.low, ci.low, rel=1e-6, abs_=1e-6) and close(mine.high, ci.high, rel=1e-6, abs_=1e-6)


def scipy_power(effect: float, n: int, paired: bool) -> float:
    """The two-sided t-test's power, straight from scipy's noncentral t."""
    df = n - 1 if paired else 2 * n - 2
    nc = effect * math.sqrt(n if paired else n / 2)
    crit = scipy_stats.t.ppf(0.975, df)
    return scipy_stats.nct.sf(crit, df, nc) + scipy_nct_cdf(-crit, df, nc)


@pytest.mark.parametrize("paired", [False, True])
@pytest.mark.parametrize("effect", [0.3, 0.8, 2.5, 6.0])
@pytest.mark.parametrize("n", [2, 5, 40])
def test_power_matches_the_noncentral_t(effect, n, paired):
    assert close(S.power(effect, n, paired), scipy_power(effect, n, paired), abs_=1e-7)


def scipy_nct_cdf(t: float, df: float, nc: float) -> float:
    """scipy's noncentral t CDF; where scipy 1.17 answers nan far in the left tail, 1 - its survival function."""
    v = scipy_stats.nct.cdf(t, df, nc)
    return 1.0 - scipy_stats.nct.sf(t, df, nc) if math.isnan(v) else v


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.floats(min_value=-1e3, max_value=1e3), st.integers(1, 400), st.floats(min_value=-30, max_value=30))
def test_noncentral_t_cdf_matches_scipy(t, df, nc):
    ref = scipy_nct_cdf(t, df, nc)
    assume(not math.isnan(ref))
    assert close(S.nct_cdf(t, df, nc), ref, abs_=1e-7)
    assert close(S.nct_cdf(-2.0, 1, 9.0), scipy_nct_cdf(-2.0, 1, 9.0), abs_=1e-7)  # where scipy's cdf gives nan


@pytest.mark.parametrize("paired", [False, True])
@pytest.mark.parametrize("effect", [0.2, 0.5, 0.8, 1.5, 3.0])
def test_seeds_needed_is_the_smallest_n_with_80_percent_power(effect, paired):
    n = S.seeds_needed(effect, paired=paired)
    assert scipy_power(effect, n, paired) >= 0.8
    assert n == 2 or scipy_power(effect, n - 1, paired) < 0.8
    assert S.seeds_needed(-effect, paired=paired) == n  # the sign of the effect does not matter
    assert S.seeds_needed(0.0) is None


def same(mine: float, ref: float) -> bool:
    return (math.isnan(mine) and math.isnan(ref)) or mine == ref


@pytest.mark.parametrize(("a", "b"), [
    ([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]),  # identical arms: no difference, no spread
    ([0.3125, 0.5, 0.4375], [0.5625, 0.75, 0.6875]),  # identical differences (+0.25 in every seed)
    ([0.5, 0.25], [0.25, 0.0]),  # identical negative differences
])
@pytest.mark.filterwarnings("ignore:Precision loss")
def test_identical_paired_differences_are_degenerate_as_scipy_says(a, b):
    """Zero variance: t and p as scipy gives them (t = +-inf, p = 0; or nan, nan for no difference), marked
    degenerate and never called significant (issue 30 §2.8)."""
    r = S.paired(a, b)
    ref = scipy_stats.ttest_rel(b, a)
    assert r.degenerate and not r.significant and r.seeds_needed is None
    assert same(r.t, float(ref.statistic)) and same(r.p, float(ref.pvalue)), (r, ref)
    assert r.df == ref.df and r.low == r.high == r.diff


@pytest.mark.parametrize(("a", "b"), [([1.0, 1.0], [2.0, 2.0]), ([0.5, 0.5, 0.5], [0.5, 0.5, 0.5])])
@pytest.mark.filterwarnings("ignore:Precision loss")
def test_constant_arms_are_a_degenerate_welch_test_as_scipy_says(a, b):
    r = S.welch(a, b)
    ref = scipy_stats.ttest_ind(b, a, equal_var=False)
    assert r.degenerate and not r.significant
    assert same(r.t, float(ref.statistic)) and same(r.p, float(ref.pvalue)), (r, ref)


def test_rounding_noise_is_no_spread():
    """Differences of means that differ only in their last bits are identical: scipy answers t ~ 1e16 with a
    warning of catastrophic cancellation; rlctl says degenerate."""
    a = [0.1, 0.2, 0.7]
    b = [x + 0.3 for x in a]  # 0.1 + 0.3 - 0.1 != 0.3 in binary
    assert len({y - x for x, y in zip(a, b, strict=True)}) > 1
    r = S.paired(a, b)
    assert r.degenerate and math.isinf(r.t) and r.p == 0.0
    assert not S.paired(a, [0.4, 0.5, 1.0 + 1e-9]).degenerate  # a real (if tiny) spread is a test


@pytest.mark.filterwarnings("ignore:Precision loss")
def test_a_constant_arm_or_identical_pairs_do_not_divide_by_zero():
    r = S.welch([1.0, 1.0], [2.0, 3.0])  # one constant arm, one that varies: an ordinary Welch test
    ref = scipy_stats.ttest_ind([2.0, 3.0], [1.0, 1.0], equal_var=False)
    assert not r.degenerate and close(r.t, ref.statistic) and close(r.p, ref.pvalue, rel=1e-6)
    with pytest.raises(ValueError):
        S.welch([1.0], [1.0, 2.0])


def test_a_runs_window_never_holds_its_step_0_baseline():
    """Evals at steps 0, 20, 40, 60 of 0, 1, 1, 1: the arm's value was 0.75 with the default window of 5, the base
    model's step-0 baseline counted as a value of the trained run. It is 1.0; a curve of the baseline alone stays."""
    from rlctl.experiments.report import final_value, trained_curve

    curve = [(0, 0.0), (20, 1.0), (40, 1.0), (60, 1.0)]
    assert final_value(trained_curve(curve), 5) == 1.0
    assert trained_curve([(0, 0.3)]) == [(0, 0.3)]


def test_compare_leaves_the_step_0_baseline_out_of_each_run(tmp_path):
    import json

    from rlctl.core.state import write_state
    from rlctl.experiments.report import compare

    runs = {}
    for arm, later in (("a", 1.0), ("b", 0.5)):
        runs[arm] = []
        for seed in (1, 2):
            rd = tmp_path / f"{arm}{seed}"
            rd.mkdir()
            write_state(rd, status="finished", backend="command")
            rows = [{"step": 0, "eval/id/greedy_pass@1": 0.0}] + [
                {"step": s, "eval/id/greedy_pass@1": later + 0.01 * seed} for s in (20, 40, 60)]
            (rd / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            runs[arm].append((rd, seed))
    c = compare([{"id": "a"}, {"id": "b"}], runs, "eval/id/greedy_pass@1", 5)
    got = {a.id: sorted(round(v, 6) for v in a.values) for a in c.arms}
    assert got == {"a": [1.01, 1.02], "b": [0.51, 0.52]}, got


def test_a_run_on_a_host_compares_by_the_recipe_this_machine_resolved(tmp_path):
    """A run launched with --on keeps the host's recipe.toml mirrored here, whose paths are the host's staged copies
    (.rlctl/stage/<id>/...): compared with a local run of the same recipe it was another arm ("data.train differs",
    Welch instead of the paired test). launch --on keeps this machine's resolution beside it; compare reads that."""
    from rlctl.core.state import HERE_RECIPE, write_state
    from rlctl.experiments.report import arms_of_runs

    here = '[data]\ntrain = "/home/u/work/quickstart/prompts.jsonl"\n[train]\nseed = 1\n'
    staged = '[data]\ntrain = "/box1/rlctl/.rlctl/stage/20261127-x/quickstart/prompts.jsonl"\n[train]\nseed = 2\n'
    local, remote = tmp_path / "runs" / "l-20261127-000000", tmp_path / "runs" / "r-20261127-000000"
    for rd, text in ((local, here), (remote, staged)):
        rd.mkdir(parents=True)
        (rd / "recipe.toml").write_text(text)
        write_state(rd, status="finished")
    (remote / HERE_RECIPE).write_text(here.replace("seed = 1", "seed = 2"))
    arms, runs = arms_of_runs([str(local), str(remote)])
    assert len(arms) == 1 and [s for _, s in runs["a0"]] == [1, 2], (arms, runs)
