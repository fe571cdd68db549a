"""Property-based tests: arbitrary text and bytes never raise anything but rlctl's own user-facing errors."""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlctl.backends import BUILTIN, get_backend
from rlctl.errors import RlctlError
from rlctl.metrics.parsers import STAND_IN, STAND_IN_CURRENT, Malformed
from rlctl.metrics.stream import METRICS, ingest, iter_metrics
from rlctl.recipe.loader import load, parse_set

PARSERS = {name: get_backend(name).parse for name in BUILTIN}  # each adapter's parser
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
toml_like = st.text(alphabet=st.sampled_from(list("[]=.\"'#\n abcdegknrt_0123456789-{},:\\")), max_size=200)


@SETTINGS
@given(st.one_of(st.binary(max_size=300), toml_like.map(str.encode), st.text(max_size=200).map(str.encode)))
def test_recipe_loader_raises_only_recipe_errors(data):
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "r.toml"
        p.write_bytes(data)
        try:
            load(p)
        except RlctlError as e:
            assert str(e)  # a message a person can read


@SETTINGS
@given(st.text(max_size=80))
def test_set_parser_never_crashes(expr):
    with contextlib.suppress(RlctlError):
        parse_set(expr)


metricish = st.one_of(
    st.text(max_size=200),
    st.builds(lambda k, v: f"step:{k} - {v}", st.integers(-5, 10**6), st.text(max_size=80)),
    st.builds(lambda k, v: f"12:00:00 SUCCESS Step {k} | {v}", st.integers(0, 10**6), st.text(max_size=80)),
    st.builds(lambda k, v: f"✨ Global step {k}: {v}", st.integers(0, 10**6), st.text(max_size=80)),
    st.builds(lambda e, v: f"Train epoch [{e}/2]: 100%|##| 3/3 [00:01<00:00, act_loss={v}, act_lr=1e-6]",  # stand-ins
              st.integers(1, 2), st.text(max_size=20)),
    st.builds(lambda d: repr(d), st.dictionaries(st.text(max_size=8), st.one_of(
        st.floats(allow_nan=True), st.integers(), st.text(max_size=8), st.none()), max_size=6)),
)


@SETTINGS
@given(metricish)
def test_parsers_return_a_record_none_or_malformed(line):
    for name, parser in PARSERS.items():
        try:
            rec = parser(line)
        except Malformed:
            continue
        if rec is not None:
            # own step, current (None), counted (absent) or a stand-in (parsers.STAND_IN, STAND_IN_CURRENT)
            assert isinstance(rec.get("step"), int | None) or rec["step"] in (STAND_IN, STAND_IN_CURRENT), name
            json.dumps(rec, allow_nan=False)  # what goes into the stream is valid JSON


@SETTINGS
@given(st.lists(st.one_of(st.binary(max_size=120), metricish.map(str.encode)), max_size=30),
       st.sampled_from(sorted(PARSERS)))
def test_ingest_never_raises_and_writes_valid_json_lines(chunks, backend):
    with tempfile.TemporaryDirectory() as d:
        run = Path(d)
        (run / "stdout.log").write_bytes(b"\n".join(chunks))
        ingest(run, backend)
        ingest(run, backend, final=True)
        for line in (run / METRICS).read_text().splitlines() if (run / METRICS).exists() else []:
            json.loads(line)
        list(iter_metrics(run / METRICS))


# ---- pruning: whatever the layout says, the newest complete checkpoint and anything newer stay ----------------

@SETTINGS
@given(st.lists(st.tuples(st.integers(0, 10**6), st.booleans()), max_size=20, unique_by=lambda t: t[0]),
       st.integers(1, 6), st.sets(st.integers(0, 10**6), max_size=3))
def test_plan_prune_never_deletes_the_newest_complete_or_newer(ckpts, keep_last, keep_steps):
    from rlctl.backends.layout import Checkpoint
    from rlctl.runs.checkpoints import plan_prune

    cs = [Checkpoint(step, Path(f"/x/checkpoint-{step}"), done) for step, done in sorted(ckpts)]
    doomed = plan_prune(cs, keep_last, keep_steps)
    complete = [c.step for c in cs if c.complete]
    if not complete:
        assert doomed == []
        return
    newest = complete[-1]
    steps = {c.step for c in doomed}
    assert all(s < newest for s in steps)
    assert not steps & set(complete[-keep_last:]) and not steps & keep_steps
    assert len([s for s in complete if s not in steps]) >= min(keep_last, len(complete))


# ---- secrets: one rule, and a masked record never holds a value stored under a secret name -------------------

secret_names = st.sampled_from(["HF_TOKEN", "DB_PASSWORD", "WANDB_API_KEY", "hub_token", "api_key", "MY_SECRET",
                                "AWS_SECRET_ACCESS_KEY", "auth", "SENTRY_DSN", "x_pass"])
plain_names = st.sampled_from(["input_key", "label_key", "lr", "steps", "name", "prompt_key", "max_tokens"])
values = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_", min_size=8, max_size=24).map(lambda s: "S3" + s)


@SETTINGS
@given(st.recursive(st.dictionaries(st.one_of(secret_names, plain_names), values, max_size=4),
                    lambda inner: st.dictionaries(st.one_of(plain_names, st.sampled_from(["env", "extra"])), inner,
                                                  max_size=3), max_leaves=12))
def test_masked_recipe_data_holds_no_secret_value(data):
    from rlctl.backends.base import is_secret_name
    from rlctl.runs.rundir import masked_recipe_data

    planted, plain = [], set()

    def collect(node):
        for k, v in node.items():
            if isinstance(v, dict):
                collect(v)
            elif is_secret_name(k):
                planted.append(v)
            else:
                plain.add(v)

    collect(data)
    text = json.dumps(masked_recipe_data(data))
    for v in planted:
        assert v in plain or json.dumps(v) not in text  # the rule is by name: the same text under `lr` is not secret


@SETTINGS
@given(st.lists(st.one_of(
    st.builds(lambda k, v: f"--set=env.{k}={v}", secret_names, values),
    st.builds(lambda k, v: f"{k}={v}", secret_names, values),
    st.builds(lambda k, v: ["--" + k.lower().replace("_", "-"), v], secret_names, values),
    st.builds(lambda k, v: ["--set", f"backend.trl.extra.{k}={v}"], secret_names, values),
    st.text(max_size=10)), max_size=6))
def test_mask_argv_hides_every_value_given_to_a_secret_name(parts):
    from rlctl.runs.rundir import mask_argv

    argv, planted = ["rlctl"], []
    for p in parts:
        items = p if isinstance(p, list) else [p]
        argv += items
        if any("=" in i or i.startswith("--") for i in items) and any(s.startswith("S3") for s in items[-1:]):
            planted.append(items[-1].split("=")[-1])
    masked = " ".join(mask_argv(argv, {}))
    for v in planted:
        assert v not in masked


# ---- the reward check reads any text as Python without importing or crashing ---------------------------------

@SETTINGS
@given(st.one_of(st.text(max_size=300), st.sampled_from(["def reward_func(x): pass", "from m import *",
                                                         "try:\n  from a import f\nexcept Exception:\n  f = None"])))
def test_defined_names_never_crashes(source):
    import ast

    from rlctl.preflight.references import defined_names

    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return
    names, star = defined_names(tree)
    assert isinstance(names, set) and isinstance(star, bool)
