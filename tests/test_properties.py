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
from rlctl.metrics.parsers import Malformed
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
            assert isinstance(rec.get("step"), int | None), name  # own step, current (None) or counted (absent)
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
