"""The fast ingestion path (chunk prefilter, bulk readers, JSON in C) reads exactly what the line-by-line reader of
af8ba80 read (tests/ingest_reference, frozen), on the committed fixtures and on generated lines; following a log
costs only its new bytes."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlctl.metrics import stream
from rlctl.metrics.stream import METRICS, IngestState, _Reader, adapter, ingest
from tests.conftest import FIXTURES
from tests.ingest_reference import ingest_file

OLD_FORMATS = [  # the fixtures of formats the af8ba80 reader read (later ones: tests/test_metrics_formats.py)
    *((p, "verl") for p in sorted((FIXTURES / "verl").glob("*.log"))),
    *((p, "prime_rl") for p in sorted((FIXTURES / "prime_rl").glob("*.log"))),
    *((FIXTURES / f"openrlhf/console-{v}.log", "openrlhf") for v in ("0.6.0", "0.9.3", "0.11.2")),
    (FIXTURES / "trl/stdout.log", "trl"),
    (FIXTURES / "trl/console-no-step.log", "trl"),
]


def _records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [{k: v for k, v in json.loads(line).items() if k != "time"} for line in path.read_text().splitlines()]


def both(log: Path, backend: str, tmp: Path, chunk: int | None = None) -> tuple:
    """(old, new): each reader's records and counts on one log."""
    old = ingest_file(log, backend, tmp / "old.jsonl")
    ad = adapter(backend)
    reader = _Reader(ad.parse, tuple(ad.metric_needles), tmp / "new.jsonl", getattr(ad, "metric_bulk", None))
    if chunk:
        saved, stream.CHUNK = stream.CHUNK, chunk
    try:
        new = reader.file(log, IngestState(), True)
    finally:
        if chunk:
            stream.CHUNK = saved
    a = (_records(tmp / "old.jsonl"), old.lines, old.records, old.skipped, old.examples, old.last_step)
    b = (_records(tmp / "new.jsonl"), new.lines, new.records, new.skipped, new.examples, new.last_step)
    (tmp / "old.jsonl").unlink(missing_ok=True)
    (tmp / "new.jsonl").unlink(missing_ok=True)
    return a, b


@pytest.mark.parametrize("log,backend", OLD_FORMATS, ids=lambda x: getattr(x, "name", x))
def test_fast_path_reads_the_fixtures_exactly_as_before(log, backend, tmp_path):
    old, new = both(log, backend, tmp_path)
    assert old[0], "the fixture gives records"
    assert new == old


@pytest.mark.parametrize("chunk", [7, 64, 1000])
def test_chunk_boundaries_change_nothing(chunk, tmp_path):
    """Lines cut by the chunk size (a record wrapped over lines, CR frames, ANSI) read the same as in one chunk."""
    for log, backend in [(FIXTURES / "openrlhf/console-0.9.3.log", "openrlhf"), (FIXTURES / "verl/console.log", "verl"),
                         (FIXTURES / "prime_rl/orchestrator.log", "prime_rl")]:
        old, new = both(log, backend, tmp_path, chunk=chunk)
        assert new == old


# ---- generated lines -----------------------------------------------------------------------------------------

KEYS = st.sampled_from(["actor/entropy", "actor/kl_loss", "critic/kl", "actor/pg_loss", "critic/score/mean",
                        "val-core/gsm8k/acc/mean@1", "val/x", "actor/entropy_loss", "actor/reward_kl_penalty",
                        "timing_s/gen", "perf/throughput", "response_length/mean", "a b", "x:y", "step", "time",
                        "global_seqlen/mean", "loss", "reward", "learning_rate", "eval_loss", "train_runtime",
                        "clip_ratio/region_mean", "clip_ratio", "policy_loss", "kl", "actor_lr", "k'q", ""])
NUMBER = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=64).map(repr),
    st.integers(-10**20, 10**20).map(str),
    st.sampled_from(["0.000", "1e-06", "1E5", "-0", "-0.0", "01", ".5", "1.", "+3", "1e400", "1e-400", "nan", "inf",
                     "np.float64(0.5)", "np.float32(nan)", "tensor(0.5)", "True", "None", "abc", "1.2s", " 7",
                     "12345678901234567", "9007199254740993", "'0.5'", '"x"', "\\n", "{", "}", "[1]"]),
)


@st.composite
def verl_line(draw) -> str:
    fields = draw(st.lists(st.tuples(KEYS, NUMBER), max_size=8))
    sep = draw(st.sampled_from([" - ", " - ", " - ", " -  ", "  - ", " -\t"]))
    body = sep.join(f"{k}:{v}" for k, v in fields)
    prefix = draw(st.sampled_from(["", "", "(TaskRunner pid=9) ", "(pid=1, ip=10.0.0.1) ", "  ", "\x1b[36m", "x "]))
    suffix = draw(st.sampled_from(["", "", " -", " - ", " [repeated 3x across cluster]", "\x1b[0m", "\r"]))
    step = draw(st.sampled_from(["1", "2", "007"]))  # garbled steps: counted now (test_metrics_formats.py)
    return f"{prefix}step:{step}" + (f" - {body}" if body or draw(st.booleans()) else "") + suffix


@st.composite
def dict_line(draw) -> str:
    fields = draw(st.lists(st.tuples(KEYS, NUMBER), max_size=8))
    quote = draw(st.sampled_from(["", "'", "'"]))
    inner = ", ".join(f"'{k}': {quote}{v}{quote}" for k, v in fields)
    step = draw(st.sampled_from(["", ", 'step': 3", ", 'step': '4'"]))
    head = draw(st.sampled_from(["", "(PPOTrainer pid=4242) INFO 01-06 09:20:11 ppo_trainer.py:321] ✨ Global step 5: ",
                                 "Global step 6: ", "  "]))
    tail = draw(st.sampled_from(["}", "}", "", "} \r{'loss': 1.0}"]))  # `...}` cut dicts: read now (ditto)
    return head + "{" + inner + step + tail


@st.composite
def prime_line(draw) -> str:
    n = draw(st.integers(0, 9))
    fields = draw(st.lists(st.tuples(st.sampled_from(["Reward", "Loss", "Time", "Seq. Length", "Throughput",
                                                     "Grad. Norm", "LR", "Truncation", "Odd"]), NUMBER), max_size=6))
    colon = draw(st.sampled_from([": ", " "]))
    return f"02:33:26 SUCCESS Step {n} | " + " | ".join(f"{k}{colon}{v}" for k, v in fields)


@st.composite
def command_line(draw) -> str:
    value = st.one_of(st.integers(-10**20, 10**20).map(str), st.floats(allow_nan=False).map(repr),
                      st.sampled_from(["NaN", "Infinity", "true", "null", '"x"', "[1]", "{}", "1e400", "-0", "01"]))
    fields = draw(st.lists(st.tuples(st.sampled_from(["step", "loss", "reward/mean", "kl", "x"]), value), max_size=6))
    inner = ", ".join(f'"{k}": {v}' for k, v in fields)
    tail = draw(st.sampled_from(["}}", "}}", "}} ", "}", "}}\r"]))
    return '{"rlctl_command": {' + inner + tail


FILLER = ["INFO vllm: Avg prompt throughput: 1523.4 tokens/s", "", "Generating: 50%|#####| 64/128", "\r", "  "]


def _log(lines: list[str], rnd: random.Random) -> str:
    out = []
    for line in lines:
        out.append(line)
        out.extend(rnd.choice(FILLER) for _ in range(rnd.randint(0, 2)))
    return "\n".join(out) + rnd.choice(["\n", ""])


@pytest.mark.parametrize("backend,lines", [("verl", verl_line()), ("openrlhf", dict_line()), ("trl", dict_line()),
                                           ("prime_rl", prime_line()), ("command", command_line())])
def test_fast_path_reads_generated_lines_exactly_as_before(backend, lines, tmp_path):
    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.lists(lines, min_size=1, max_size=12), st.randoms(use_true_random=False))
    def check(generated, rnd):
        log = tmp_path / "gen.log"
        log.write_text(_log(generated, rnd))
        old, new = both(log, backend, tmp_path)
        assert new == old, log.read_text()

    check()


@given(st.lists(st.tuples(st.sampled_from(["step", "reward/mean", "kl", "x"]),
                          st.one_of(st.integers(-10**25, 10**25), st.floats(), st.text(max_size=5), st.none())),
                max_size=6))
@settings(max_examples=80, deadline=None)
def test_writer_fast_and_plain_give_the_same_records(pairs):
    """The one-call JSON-lines writer and the record-by-record one write the same values."""
    import tempfile

    recs = [{"step": i, **dict(pairs)} | {"step": i} for i in range(3)]
    with tempfile.TemporaryDirectory() as d:
        a, b = Path(d) / "a", Path(d) / "b"
        try:
            stream.write_records(a, recs, now=5.0)
        except ValueError:  # NaN: the standard library refuses it (clean_value never lets one through)
            return
        saved = stream._orjson
        stream._orjson = None
        try:
            stream.write_records(b, recs, now=5.0)
        except ValueError:
            return
        finally:
            stream._orjson = saved
        # lines end at "\n" only: a string value may hold U+0085 unescaped (orjson writes it so)
        assert [json.loads(x) for x in a.read_text().split("\n") if x] == [
            json.loads(x) for x in b.read_text().split("\n") if x]


# ---- following a growing log ---------------------------------------------------------------------------------


def _read_bytes() -> int:
    """Bytes this process has read through read() and friends (Linux /proc/self/io `rchar`)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar")


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux /proc/self/io")
def test_following_a_growing_log_reads_only_the_new_bytes(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    line = "(TaskRunner pid=1) step:{} - actor/pg_loss:0.1 - critic/score/mean:0.5 - " + "x/y:1.0 - " * 20 + "z:2\n"
    filler = "INFO some noise that is not metrics " * 4 + "\n"
    with (run / "stdout.log").open("w") as fh:
        for i in range(1, 30001):
            fh.write(line.format(i) + filler * 3)
    big = (run / "stdout.log").stat().st_size
    assert big > 20_000_000
    ingest(run, "verl")
    metrics_size = (run / METRICS).stat().st_size
    with (run / "stdout.log").open("a") as fh:
        fh.write(line.format(30001) + filler)
    added = (run / "stdout.log").stat().st_size - big
    before = _read_bytes()
    st = ingest(run, "verl")
    read = _read_bytes() - before
    assert st.records == 30001
    assert read < 64 * 1024 + added, f"read {read} bytes to ingest {added} new ones of a {big}-byte log"
    assert (run / METRICS).stat().st_size > metrics_size
    recs = stream.tail_records(run / METRICS, 4096)
    assert recs[-1]["step"] == 30001


# ---- the bulk readers on whole chunks: edge lines among many plain ones -----------------------------------------

GOOD = {
    "verl": "(TaskRunner pid=7) step:{} - actor/pg_loss:0.013 - critic/score/mean:0.41 - actor/lr:1e-06",
    "prime_rl": "02:33:26 SUCCESS Step {} | Time: 73.77s | Reward: 0.3887 | Throughput: 2408.9 tokens/s | "
                "Seq. Length: 345.6 tokens/sample | Async Level: 1",
    "openrlhf": "(PPOTrainer pid=4242) INFO 01-06 09:20:11 ppo_trainer.py:321] ✨ Global step {}: {{'policy_loss': "
                "-0.0123, 'actor_lr': 5e-07, 'kl': 0.0004, 'reward': 0.43}}",
    "trl": "{{'loss': '0.0123', 'grad_norm': '0.51', 'learning_rate': '1e-06', 'reward': '0.43', 'step': {}}}",
    "command": '{{"rlctl_command": {{"step": {}, "policy_loss": 0.0123, "reward/mean": 0.43, "kl": 0.001}}}}',
}
EDGES = {
    "verl": ["(TaskRunner pid=8) step:3 - actor/pg_loss:0.5", "(pid=1, ip=10.0.0.1) step:3 - a:1",
             "(pid=1, ip=::1) step:3 - a:1", "step:-0 - a:1", "step: 5 - a:1", "step:5 - a:1 -", "step:05 - a:1",
             "step:5 - a:1 - global_step:3", "step:5 - a:nan", "step:5 - a:1e400", "step:5 - a:12345678901234567",
             "step:5 - a:1\r - b:2", "\x1b[36mstep:5 - a:1\x1b[0m", "step:5", "step:5 - step:6", "step:5 - time:1",
             "x step:5 - a:1", "step:5 - a:1  - b:2", "step:5 - a:true", "step:5 - a:[1]", "step:5 - a :1",
             "step:5 - a:1 -  b:2", "step:5 - :1", "step:5 - a:1 - :2", "step:5 - a: -1", "step:5 - a:1 - b: - c:2"],
    "prime_rl": ["02:33:26 SUCCESS Step 5", "02:33:26 SUCCESS Step -0 | Reward: 1", "Step 5.0 | Reward: 1",
                 "Step 05 | Reward: 1", "Step  5 | Reward: 1", "Step 5  | Reward: 1", "Step 5 | Time: 73.77 s",
                 "Step 5 | Time: 5s", "Step 5 | Time: 1.1234567s", "Step 5 | Time: 73.77", "Step 5 | Time: 1m 5s",
                 "\x1b[32mStep 5 | Reward: 1\x1b[0m", "Step 5 | Truncation: 5%", "Step 5 |  Reward: 1",
                 "Step 5 | Reward: 1  | Loss: 2", "Step 5 | Foo GiB: 5 GiB", "Step 5 | Reward: 1e400",
                 "Step 5 | Reward: 12345678901234567", "Step 5 | Reward: 1 | Reward: 2", "Step 5 | TIME: 1",
                 "Step 5 | Peak Mem.: 71.2/80.0 GiB (89.0%)", "Step 5 | Reward 0.5", "Step 5 | Step: 3",
                 "Step 5 | Reward: 5tokens/s", "Step 5 | Reward:\t1", "INFO Step 5 | Reward: 1", "Step 5 | Reward: 1s"],
    "openrlhf": ["Global step 5: {'kl': 1}", "✨ Global step 5: {'kl': 1}", "Global step 5:  {'kl': 1}",
                 "Global step 05: {'kl': 1}", "Global step 5: {'train/x': 1}", "Global step 5: {'global_step': 3}",
                 "(PPOTrainer pid=1, ip=10.0.0.1) Global step 5: {'kl': '0.5'}", "Global step 5: {'kl': nan}",
                 "Global step 5: {'kl': 1, ...}", "Global step 5: {'kl': 1}\r", "x Global step 5: {'kl': 1}",
                 "Global step 5: {'a': '1, 'b': 2', 'c': 3}", "Global step 5: {'kl': 12345678901234567}"],
    "trl": ["{'a': '1, 'b': 2', 'c': 3, 'loss': 1}", "{'loss': '0.5', 'step': 5.0}", "{'loss': 'nan', 'step': 3}",
            "{'loss': '1e400', 'step': 3}", "{'loss': '12345678901234567'}", "{'loss': 1}\t", "{'eval_loss': 1}",
            "{'loss': '0.5 '}", "{'loss': ' 1'}", "{'loss': '01'}", "{'loss': True}", "{'loss': '0.5', 'time': 1}",
            "{'loss': 1, 'clip_ratio/region_mean': 2, 'clip_ratio': 3}", "{'x': 1}", "{'loss': {'a': 1}}",
            "{'loss': '0.5'} {'loss': 2}", "{'train_runtime': 5}", "{'loss': 1, 'step': '4'}", "{'loss': \"x\"}"],
    "command": ['{"rlctl_command": {"step": 1, "loss": NaN}}', '{"rlctl_command": {"step": 1.5, "loss": 1}}',
                '{"rlctl_command": {"loss": 1}}', '{"rlctl_command": {"step": 1, "loss": "x"}}',
                '{"rlctl_command": {"step": 1, "loss": 1}, "other": 2}', '{"rlctl_command": {"step": 1}}\r',
                '{"rlctl_command": {"step": 1, "loss": 123456789012345678901}}', '{"rlctl_command": 5}}',
                '{"rlctl_command": {"step": true}}', '{"rlctl_command": {"step": 1, "l": [1]}}'],
}


def with_and_without_bulk(log: Path, backend: str, tmp: Path) -> tuple:
    """(line by line, bulk): the same reader with and without the adapter's bulk reader (parse is the oracle, for
    lines the reference reads otherwise by design, e.g. garbled steps)."""
    ad = adapter(backend)
    out = []
    for bulk in (None, ad.metric_bulk):
        reader = _Reader(ad.parse, tuple(ad.metric_needles), tmp / "m.jsonl", bulk)
        st = reader.file(log, IngestState(), True)
        out.append((_records(tmp / "m.jsonl"), st.lines, st.records, st.skipped, st.examples, st.last_step))
        (tmp / "m.jsonl").unlink(missing_ok=True)
    return tuple(out)


@pytest.mark.parametrize("backend", list(GOOD))
def test_bulk_readers_fall_back_exactly_on_every_edge_line(backend, tmp_path):
    """Each edge line among 40 plain ones (a chunk the bulk reader takes whole, then not), one at a time and all
    together: the records, counts and examples are parse's line by line."""
    good = [GOOD[backend].format(i) for i in range(1, 41)]
    name = "backend_metrics.jsonl" if backend == "command" else "gen.log"
    for edge in [*EDGES[backend], "\n".join(EDGES[backend])]:
        log = tmp_path / name
        log.write_text("\n".join(good[:20] + [edge] + good[20:]) + "\n")
        old, new = with_and_without_bulk(log, backend, tmp_path)
        assert new == old, edge
    log.write_text("\n".join(good) + "\n")
    old, new = with_and_without_bulk(log, backend, tmp_path)
    assert new == old and len(new[0]) == 40
    assert len(adapter(backend).metric_bulk(log.read_text())) == 40  # all read in bulk


# ---- the bulk readers' one-template blocks: every line the first one's keys and units, any numbers -----------------

VALID_NUMBER = st.one_of(
    st.integers(0, 10**6).map(str), st.floats(0, 1e6, allow_nan=False).map(repr),
    st.decimals(0, 10**6, places=8, allow_nan=False, allow_infinity=False).map(str),
    st.decimals(0, 10**3, places=2, allow_nan=False, allow_infinity=False).map(str),
)
PLAIN_NUMBER = st.one_of(
    VALID_NUMBER, st.integers(0, 10**16).map(str), st.floats(0, 1e16, allow_nan=False).map(repr),
    st.sampled_from(["0", "0.0", "00", "01", "1.", ".5", "1.0000001", "999999999999999", "1000000000000000",
                     "0.1234567890123456789", "1e-06", "1E5", "-0", "-1.5", "5e400", "1e-400", "1.2.3", "e5", "+1"]),
)
PRIME_FIELDS = [("Time", "s"), ("Reward", ""), ("Throughput", " tokens/s"), ("Seq. Length", " tokens/sample"),
                ("Async Level", ""), ("Loss", ""), ("Grad. Norm", ""), ("Peak Mem.", " GiB"), ("MFU", "%"),
                ("Max. Off-Policy Level", ""), ("Odd", "s"), ("Step", ""), ("Truncation", "%")]
EXAMPLES = 200
TRL_KEYS = ["loss", "grad_norm", "learning_rate", "reward", "kl", "eval_loss", "time", "clip_ratio",
            "clip_ratio/region_mean", "x", "train_runtime", "episode"]


@st.composite
def prime_block(draw) -> list[str]:
    fields = draw(st.lists(st.sampled_from(PRIME_FIELDS), min_size=1, max_size=5, unique=True))
    head = draw(st.sampled_from(["02:33:26 SUCCESS ", "", "02:33:26  INFO ", "2:33:26 SUCCESS "]))
    odd = draw(st.booleans())  # odd numbers and steps among the plain ones, or none
    numbers = PLAIN_NUMBER if odd else VALID_NUMBER
    times = st.one_of(numbers, st.sampled_from(["73.77", "0.5", "1.1234567", "123456789.5", "1234567890.5"]))
    steps = st.integers(0, 10**6).map(str)
    if odd:
        steps = st.one_of(steps, st.integers(0, 10**16).map(str), st.sampled_from(["05", "-1", "5.0", ""]))
    out = []
    for _ in range(draw(st.integers(2, 8))):
        step = draw(steps)
        body = " | ".join(f"{k}: {draw(times if k == 'Time' else numbers)}{u}" for k, u in fields)
        out.append(f"{head}Step {step} | {body}")
    return out


@st.composite
def trl_block(draw) -> list[str]:
    keys = draw(st.lists(st.sampled_from(TRL_KEYS), min_size=1, max_size=5, unique=True))
    quotes = [draw(st.sampled_from(["'", ""])) for _ in keys]
    step = draw(st.sampled_from(["", "'step': {}, ", ", 'step': {}"]))
    odd = draw(st.booleans())
    numbers = PLAIN_NUMBER if odd else VALID_NUMBER
    steps = st.integers(0, 10**6).map(str)
    if odd:
        steps = st.one_of(steps, st.integers(-5, 10**16).map(str), st.sampled_from(["05", "5.0", "-0", "1e3"]))
    out = []
    for _ in range(draw(st.integers(2, 8))):
        inner = ", ".join(f"'{k}': {q}{draw(numbers)}{q}" for k, q in zip(keys, quotes, strict=True))
        s = draw(steps)
        inner = step.format(s) + inner if step.startswith("'") else inner + step.format(s)
        out.append("{" + inner + "}")
    return out


@pytest.mark.parametrize("backend,blocks", [("prime_rl", prime_block()), ("trl", trl_block())])
def test_one_template_blocks_read_exactly_as_parse(backend, blocks, tmp_path):
    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(blocks)
    def check(lines):
        log = tmp_path / "gen.log"
        log.write_text("\n".join(lines) + "\n")
        old, new = with_and_without_bulk(log, backend, tmp_path)
        assert new == old, log.read_text()

    check()


@pytest.mark.parametrize("backend", ["prime_rl", "trl"])
def test_one_template_blocks_are_read_by_their_template(backend):
    from rlctl.backends.prime_rl import metrics as prime_rl
    from rlctl.backends.trl import metrics as trl

    module = {"prime_rl": prime_rl, "trl": trl}[backend]
    lines = [GOOD[backend].format(i) for i in range(1, 41)]
    out = module._uniform(list(range(40)), lines)
    assert out is not None and list(out.values()) == [adapter(backend).parse(line) for line in lines]


# ---- a per-run parser's own bulk reader: the command backend's attached parser (attach --backend command) ---------

OTHER_JSON = st.sampled_from(['{"step": 3, "loss": 0.5}', '{"epoch": 1, "train": {"loss": 0.25}}', '{"x": 1',
                              "plain text", "", '  {"rlctl_command": {"step": 4, "loss": 1}}', "loss=0.5 step=9"])


@pytest.mark.parametrize("patterns", [[r"loss=(?P<loss>[0-9.]+) step=(?P<step>\d+)"], []])
def test_the_attached_command_parser_reads_in_bulk_exactly_line_by_line(patterns, tmp_path):
    """The runner's records among any trainer's JSON lines and noise, through attach's per-run parser (a metrics map,
    a log pattern or none): its bulk reader (the runner's lines) and needle (`{`, without patterns) and line by line
    with every line looked at give the same records and counts."""
    ad = adapter("command")
    parse = ad.options_parser({"metrics_map": {"loss": "policy_loss"}, "step_key": "step", "log_pattern": patterns})
    assert parse is not ad.parse and parse.metric_bulk
    assert parse.metric_needles == (() if patterns else ("{",))

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.lists(st.one_of(command_line(), OTHER_JSON), min_size=1, max_size=12), st.randoms(use_true_random=False))
    def check(generated, rnd):
        log = tmp_path / "gen.log"
        log.write_text(_log(generated, rnd))
        out = []
        for needles, bulk in (((), None), (tuple(parse.metric_needles), parse.metric_bulk)):
            reader = _Reader(parse, needles, tmp_path / "m.jsonl", bulk)
            st_ = reader.file(log, IngestState(), True)
            out.append((_records(tmp_path / "m.jsonl"), st_.lines, st_.records, st_.skipped, st_.examples))
            (tmp_path / "m.jsonl").unlink(missing_ok=True)
        assert out[1] == out[0], log.read_text()

    check()
    good = "\n".join(GOOD["command"].format(i) for i in range(1, 41)) + "\n"
    assert len(parse.metric_bulk(good)) == 40  # the runner's lines: all in bulk


def test_status_reads_a_record_whose_text_holds_a_unicode_line_break(tmp_path):
    """JSON lets U+0085 / U+2028 stand unescaped in a string (orjson writes them so): they end no line of
    metrics.jsonl, and the tail `status` reads keeps the record (str.splitlines broke the line there and dropped
    it)."""
    path = tmp_path / "metrics.jsonl"
    recs = [{"step": 1, "note": "a\x85b\u2028c", "reward/mean": 0.5}, {"step": 2, "reward/mean": 0.7}]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs), encoding="utf-8")
    got = stream.tail_records(path)
    assert [r["step"] for r in got] == [1, 2] and got[0]["note"] == "a\x85b\u2028c"
