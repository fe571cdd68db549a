"""Parsers on each backend's real output, and the stream's robustness (partial lines, CR, ANSI, bytes, rotation)."""

from __future__ import annotations

import importlib.util
import io
import json
import logging

import pytest

from rlctl.backends.openrlhf.metrics import parse as parse_openrlhf
from rlctl.backends.prime_rl.metrics import parse as parse_prime_rl
from rlctl.backends.trl.metrics import parse as parse_trl
from rlctl.backends.trl.metrics import parse_state as parse_trl_state
from rlctl.backends.verl.metrics import parse as parse_verl
from rlctl.metrics.parsers import Malformed
from rlctl.metrics.stream import METRICS, by_step, ingest, ingest_stats, iter_metrics, tail_records
from tests.conftest import FIXTURES


def _run_dir(tmp_path, log_bytes: bytes):
    d = tmp_path / "run"
    d.mkdir(exist_ok=True)
    (d / "stdout.log").write_bytes(log_bytes)
    return d


def test_a_mirrored_stream_is_never_parsed_here(tmp_path):
    """A run on an SSH host: its host parsed the log into metrics.jsonl, and both came here with the host's ingest
    offsets (another inode). Parsing the copy here again appended every record a second time (`rlctl metrics`,
    `logs --metrics` on a remote run)."""
    from rlctl.core.state import write_state

    (tmp_path / "host").mkdir()
    host = _run_dir(tmp_path / "host", (FIXTURES / "verl/console.log").read_bytes())
    ingest(host, "verl", final=True)
    here = tmp_path / "here"
    here.mkdir()
    for name in ("stdout.log", METRICS, ".ingest.json"):
        (here / name).write_bytes((host / name).read_bytes())  # as rsync copies them: new inodes
    write_state(here, executor="ssh", backend="verl", status="finished")
    before = (here / METRICS).read_bytes()
    assert ingest(here, "verl", final=True) is None
    assert (here / METRICS).read_bytes() == before


def test_verl_console_log(tmp_path):
    d = _run_dir(tmp_path, (FIXTURES / "verl/console.log").read_bytes())
    st = ingest(d, "verl", final=True)
    merged = by_step(list(iter_metrics(d / METRICS)))
    assert sorted(merged) == [0, 1, 2, 3, 4, 5]
    assert merged[0]["eval/openai/gsm8k/acc/mean@1"] == 0.508
    assert merged[1]["reward/mean"] == 0.558 and merged[1]["policy_loss"] == 0.001
    assert merged[1]["verl/global_seqlen/mean"] == 501736.75  # unmapped keys pass through
    assert merged[2]["time/step_s"] == 96.551 and merged[2]["time/generation_s"] == 74.02  # behind ANSI colours
    assert merged[3]["time/train_s"] == 75.486
    assert merged[4]["lr"] == 2e-06 and merged[4]["response_length/clip_ratio"] == 0.25
    assert merged[4]["eval/math500/reward/mean@1"] == 0.604
    assert merged[5]["policy_loss"] is None and merged[5]["grad_norm"] is None  # nan / inf
    assert st.skipped == 1  # "step:6 - actor/pg_loss" is metrics-shaped but unreadable


def test_prime_rl_orchestrator_and_trainer_merge_per_step(tmp_path):
    log = (FIXTURES / "prime_rl/orchestrator.log").read_bytes() + (FIXTURES / "prime_rl/trainer.log").read_bytes()
    d = _run_dir(tmp_path, log)
    ingest(d, "prime_rl", final=True)
    merged = by_step(list(iter_metrics(d / METRICS)))
    assert sorted(merged) == [28, 29, 30, 31]
    s28 = merged[28]
    assert s28["reward/mean"] == 0.3887 and s28["throughput/tokens_per_s"] == 2408.9
    assert s28["time/generation_s"] == 73.77
    assert s28["lr"] == 1e-05 and "grad_norm" in s28 and "policy_loss" in s28  # from the trainer's line
    assert s28["prime_rl/trainer_peak_mem"] == 71.2
    assert merged[29]["reward/mean"] == 0.4018  # line with loguru colours
    assert merged[30]["reward/mean"] == 0.7189  # after a carriage-return progress bar
    assert merged[31]["reward/mean"] == 0.9912  # no throughput field at all


def test_trl_stdout_from_a_real_run(tmp_path):
    d = _run_dir(tmp_path, (FIXTURES / "trl/stdout.log").read_bytes())
    st = ingest(d, "trl", final=True)
    merged = by_step(list(iter_metrics(d / METRICS)))
    assert sorted(merged) == list(range(1, 81))
    assert merged[1]["reward/mean"] < 0.05 and merged[80]["reward/mean"] > 0.9  # the quickstart learns
    assert merged[80]["lr"] == 0.005
    assert "trl/train_runtime" in merged[80]
    assert st.skipped == 0


def test_trl_trainer_state_json():
    recs = parse_trl_state((FIXTURES / "trl/trainer_state.json").read_text())
    steps = [r["step"] for r in recs]
    assert steps[:3] == [1, 2, 3] and steps[-1] == 40
    assert all("reward/mean" in r for r in recs[:-1])
    with pytest.raises(Malformed):
        parse_trl_state("{not json")


def _openrlhf_logger(released_source, stream):
    """OpenRLHF's own logger from the released 0.9.3 source, writing to `stream`."""
    path = released_source("openrlhf", "0.9.3") / "openrlhf/utils/logging_utils.py"
    spec = importlib.util.spec_from_file_location("openrlhf_logging_utils", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    logger = mod.init_logger("ppo_trainer")
    handler = logging.StreamHandler(stream)
    handler.setFormatter(mod.NewLineFormatter(mod._FORMAT, datefmt=mod._DATE_FORMAT))
    logger.handlers = [handler]  # its own formatter, our stream instead of stdout
    return logger


def test_openrlhf_console_made_by_its_own_logger(released_source, tmp_path):
    buf = io.StringIO()
    logger = _openrlhf_logger(released_source, buf)
    for global_step in (1, 2):
        log_status = {"policy_loss": -0.0123 * global_step, "actor_lr": 5e-07, "kl": 0.0004, "reward": 0.4 + 0.1 *
                      global_step, "return": 0.4, "response_length": 1830.5, "total_length": 2100.0,
                      "correctness": 0.5, "has_boxed": 0.9, "entropy_loss": float("nan")}
        logger.info(f"✨ Global step {global_step}: {log_status}")  # ppo_trainer.py's own line
    text = "".join(f"(PPOTrainer pid=4242) {line}\n" for line in buf.getvalue().splitlines())
    d = _run_dir(tmp_path, text.encode())
    ingest(d, "openrlhf", final=True)
    merged = by_step(list(iter_metrics(d / METRICS)))
    assert sorted(merged) == [1, 2]
    assert merged[2]["reward/mean"] == pytest.approx(0.6) and merged[2]["policy_loss"] == pytest.approx(-0.0246)
    assert merged[1]["lr"] == 5e-07 and merged[1]["correctness"] == 0.5
    assert merged[1]["openrlhf/has_boxed"] == 0.9 and merged[1]["entropy"] is None


def test_openrlhf_metrics_patch_jsonl_and_wandb_dicts():
    rec = parse_openrlhf(json.dumps({"global_step": 7, "reward": 0.5, "kl": 0.01, "grad_norm": 3.0}))
    assert rec == {"step": 7, "reward/mean": 0.5, "kl": 0.01, "grad_norm": 3.0}
    rec = parse_openrlhf("{'train/policy_loss': 0.1, 'train/reward': 0.2, 'train/global_step': 3}")
    assert rec == {"step": 3, "policy_loss": 0.1, "reward/mean": 0.2}
    rec = parse_openrlhf("{'eval/aime_eval/pass1': 0.35, 'eval/global_step': 10}")
    assert rec == {"step": 10, "eval/aime_eval/pass1": 0.35}


@pytest.mark.parametrize("parser,line", [
    (parse_trl, "{'loss': 0.1, 'reward': broken, 'step': 1}"),
    (parse_openrlhf, "✨ Global step 3: {'policy_loss': 0.1, "),
    (parse_prime_rl, "12:00:00 SUCCESS Step 3 | Time"),
])
def test_malformed_metric_lines_raise_malformed(parser, line):
    with pytest.raises(Malformed):
        parser(line)


def test_partial_last_line_waits_for_its_newline(tmp_path):
    full = "step:1 - critic/score/mean:0.5\nstep:2 - critic/score/mean:0.6"
    d = _run_dir(tmp_path, full.encode())
    ingest(d, "verl")
    assert [r["step"] for r in iter_metrics(d / METRICS)] == [1]
    with (d / "stdout.log").open("ab") as fh:
        fh.write(b" - actor/pg_loss:0.1\n")
    ingest(d, "verl")
    recs = list(iter_metrics(d / METRICS))
    assert [r["step"] for r in recs] == [1, 2] and recs[1]["policy_loss"] == 0.1


def test_non_utf8_and_binary_garbage_never_crash(tmp_path):
    blob = b"\xff\xfe\x00garbage\n" + b"step:1 - critic/score/mean:0.5 - x:\xff\xfe\n" + bytes(range(256)) + b"\n"
    d = _run_dir(tmp_path, blob)
    st = ingest(d, "verl", final=True)
    assert st.records == 1 and st.lines == 4  # bytes(range(256)) holds a newline of its own
    for backend in ("trl", "openrlhf", "prime_rl"):
        assert ingest(d, backend, final=True) is not None


def test_truncated_or_rotated_log_restarts(tmp_path):
    d = _run_dir(tmp_path, b"step:1 - critic/score/mean:0.1\nstep:2 - critic/score/mean:0.2\n")
    ingest(d, "verl")
    (d / "stdout.log").write_bytes(b"step:3 - critic/score/mean:0.3\n")  # truncated in place
    ingest(d, "verl")
    assert [r["step"] for r in iter_metrics(d / METRICS)] == [1, 2, 3]
    assert ingest_stats(d).restarts == 1
    (d / "stdout.log").rename(d / "stdout.log.1")  # rotated: a new file appears
    (d / "stdout.log").write_bytes(b"step:4 - critic/score/mean:0.4\n" * 3)
    ingest(d, "verl")
    assert [r["step"] for r in iter_metrics(d / METRICS)][-3:] == [4, 4, 4]
    assert ingest_stats(d).restarts == 2


def test_tail_records_reads_only_the_end(tmp_path):
    p = tmp_path / METRICS
    with p.open("w") as fh:
        for i in range(20000):
            fh.write(json.dumps({"step": i, "time": 0.0, "reward/mean": i / 20000}) + "\n")
    recs = tail_records(p, max_bytes=4096)
    assert recs[-1]["step"] == 19999 and len(recs) < 200
    assert tail_records(tmp_path / "missing.jsonl") == []


def test_damaged_metrics_lines_are_skipped_when_read(tmp_path):
    p = tmp_path / METRICS
    p.write_text('{"step": 1, "time": 0}\n{"step": 2, "ti\nnot json\n{"step": 3, "time": 1}\n')
    assert [r["step"] for r in iter_metrics(p)] == [1, 3]


def test_verl_unknown_prefix_keys_pass_through():
    rec = parse_verl("step:3 - actor/lr(1e-4):0.005 - critic/score/mean:2.576")
    assert rec == {"step": 3, "verl/actor/lr(1e-4)": 0.005, "reward/mean": 2.576}


def test_non_metric_lines_are_ignored_not_skipped():
    for p in (parse_trl, parse_openrlhf, parse_verl, parse_prime_rl):
        assert p("INFO 01-06 09:20:11 something happened") is None
        assert p("") is None


def test_backend_metrics_file_is_a_second_source(tmp_path):
    """OpenRLHF with rlctl's patch writes backend_metrics.jsonl; its records join the console's."""
    d = _run_dir(tmp_path, "(PPOTrainer pid=1) INFO x] ✨ Global step 1: {'reward': 0.1}\n".encode())
    (d / "backend_metrics.jsonl").write_text('{"global_step": 1, "grad_norm": 2.0}\n'
                                             '{"global_step": 2, "reward": 0.3}\n')
    st = ingest(d, "openrlhf")
    merged = by_step(list(iter_metrics(d / METRICS)))
    assert merged[1]["reward/mean"] == 0.1 and merged[1]["grad_norm"] == 2.0 and merged[2]["reward/mean"] == 0.3
    assert st.records == 3
    with (d / "backend_metrics.jsonl").open("a") as fh:
        fh.write('{"global_step": 3, "reward": 0.5}\n')
    assert ingest(d, "openrlhf").records == 4  # each source continues where it stopped


# ---- formats added with the adapters' own metrics modules ------------------------------------------------------


def test_wrapped_dict_with_prefixes_on_each_line_and_newline_formatter(tmp_path):
    """A Global step dict wrapped over lines, the continuations behind Ray's prefix or OpenRLHF's NewLineFormatter
    (`\\r\\n` + its prefix), an elided value; then a cut line followed by a new record: counted, not silent."""
    log = ("(PPOTrainer pid=1, ip=10.0.0.1) INFO 01-06 09:20:11 ppo_trainer.py:323] ✨ Global step 1: {'reward': 0.5,\n"
           "(PPOTrainer pid=1, ip=10.0.0.1) 'kl': 0.01, 'extra': ...,\n"
           "(PPOTrainer pid=1, ip=10.0.0.1) 'policy_loss': 0.2}\n"
           "INFO 01-06 09:20:12 ppo_trainer.py:323] ✨ Global step 2: {'reward': 0.6,\r\n"
           "INFO 01-06 09:20:12 ppo_trainer.py:323] 'kl': 0.02}\n"
           "✨ Global step 3: {'reward': 0.7, 'kl\n"
           "✨ Global step 4: {'reward': 0.8}\n")
    d = _run_dir(tmp_path, log.encode())
    st = ingest(d, "openrlhf", final=True)
    m = by_step(list(iter_metrics(d / METRICS)))
    assert m[1] == {**m[1], "reward/mean": 0.5, "kl": 0.01, "policy_loss": 0.2} and "openrlhf/extra" not in m[1]
    assert m[2]["kl"] == 0.02 and m[4]["reward/mean"] == 0.8 and 3 not in m
    assert st.skipped == 1 and st.examples == ["line 6: ✨ Global step 3: {'reward': 0.7, 'kl"]


def test_verl_line_ending_in_dash_and_numpy_reprs():
    rec = parse_verl("step:7 - actor/pg_loss:np.float64(0.0123) - critic/score/mean:0.625 -")
    assert rec == {"step": 7, "policy_loss": 0.0123, "reward/mean": 0.625}
    assert parse_verl("step:8 - actor/entropy_loss:1.5 - critic/kl:0.2")["entropy"] == 1.5


def test_trl_dicts_without_step_are_counted(tmp_path):
    log = ("{'loss': '0.01', 'grad_norm': '0.5', 'learning_rate': '1e-05', 'reward': '0.25', 'epoch': '0.5'}\n"
           " 50%|#####     | 1/2 [00:01<00:01]\r{'loss': 0.02, 'reward': 0.5, 'epoch': 1.0}\n"
           "{'eval_loss': 0.3, 'eval_reward': 0.4, 'epoch': 1.0}\n"
           "{'train_runtime': 2.5, 'train_loss': 0.015, 'epoch': 1.0}\n")
    d = _run_dir(tmp_path, log.encode())
    ingest(d, "trl", final=True)
    m = by_step(list(iter_metrics(d / METRICS)))
    assert sorted(m) == [1, 2]
    assert m[1]["reward/mean"] == 0.25 and m[1]["lr"] == 1e-05 and m[2]["policy_loss"] == 0.02
    assert m[2]["eval/default/reward"] == 0.4 and m[2]["trl/train_runtime"] == 2.5


def test_openrlhf_011_names():
    rec = parse_openrlhf("Global step 9: {'actor_grad_norm': 1.5, 'timing/step_total': 30.0, "
                         "'timing/generation': 20.0, 'timing/ppo_train': 9.5}")
    assert rec == {"step": 9, "grad_norm": 1.5, "time/step_s": 30.0, "time/generation_s": 20.0, "time/train_s": 9.5}
    rec = parse_openrlhf("✨ Evaluation completed in 0:00:42, global_step 10, eval_metrics: "
                         "{'eval_math_500_pass1': 0.5, 'eval_response_length_mean': 900.0}")
    assert rec == {"step": 10, "eval/math_500/pass1": 0.5, "eval/default/response_length_mean": 900.0}


def test_every_mapping_is_in_the_docs():
    """docs/metrics.md lists every key each adapter maps to a unified name."""
    from importlib import import_module
    from importlib.util import find_spec

    from rlctl.backends import BUILTIN

    doc = (FIXTURES.parents[1] / "docs/metrics.md").read_text()
    missing = []
    for name in BUILTIN:
        if find_spec(f"rlctl.backends.{name}.metrics") is None:
            continue  # an adapter whose formats come from the recipe (e.g. a command backend)
        mod = import_module(f"rlctl.backends.{name}.metrics")
        for attr in dir(mod):
            table = getattr(mod, attr)
            if attr.endswith("MAP") and isinstance(table, dict):
                missing += [f"{name}.{attr}: {k}" for k in table if f"`{k}" not in doc and f"{k}=" not in doc]
    assert not missing


def test_prime_rl_later_trainer_line():
    """prime-rl's trainer `step_message` of later releases: `Peak Mem.: {peak:.1f}/{max:.1f} GiB ({pct:.1f}%)`."""
    rec = parse_prime_rl("12:00:01 SUCCESS Step 7 | Time: 40.12s | Loss: 0.0123 | Grad. Norm: 0.2764 | LR: 1.00e-05 | "
                         "Throughput: 5077 tokens/s | MFU: 12.3% | Peak Mem.: 71.2/80.0 GiB (89.0%)")
    assert rec["step"] == 7 and rec["grad_norm"] == 0.2764 and rec["prime_rl/trainer_peak_mem"] == 71.2
    rec = parse_prime_rl("Step 8 | Time: 70.00s | Reward: 0.5000 | Val. Reward: 0.4000 | Throughput: 100.0 tokens/s")
    assert rec["reward/mean"] == 0.5 and rec["eval/default/reward"] == 0.4


def test_prime_rl_eval_line():
    """v0.8's `Evaluated <env> (Step N) | Policy vN | ...` at step N; an env name with a slash; a broken one is said."""
    rec = parse_prime_rl("12:00:01 SUCCESS Evaluated primeintellect/aime (Step 40) | Policy v38 |  1m 5s | "
                         "Reward 0.2500 | Turns 2.0 | Branches 1.0 | Error 1.5% | Truncation 50.0%")
    assert rec["step"] == 40 and next(k for k in rec if k.startswith("eval/")) == "eval/primeintellect/aime/reward"
    assert rec["eval/primeintellect/aime/reward"] == 0.25 and rec["eval/primeintellect/aime/turns"] == 2.0
    assert rec["eval/primeintellect/aime/response_length/clip_ratio"] == 0.5
    assert rec["prime_rl/eval/primeintellect/aime/policy_version"] == 38
    assert rec["prime_rl/eval/primeintellect/aime/time_s"] == 65.0
    with pytest.raises(Malformed):
        parse_prime_rl("Evaluated aime (Step 3) | Reward 0.2500")
    assert parse_prime_rl("Eval aime step 3 had mixed policy versions: [2, 3]") is None


def test_adapters_expose_their_metrics_module():
    """Each bundled adapter's parse and metric_needles are its metrics module's (the stream asks only the adapter)."""
    from importlib import import_module
    from importlib.util import find_spec

    from rlctl.backends import BUILTIN, get_backend

    for name in BUILTIN:
        if find_spec(f"rlctl.backends.{name}.metrics") is None:
            continue
        mod = import_module(f"rlctl.backends.{name}.metrics")
        adapter = get_backend(name)
        assert tuple(adapter.metric_needles) == tuple(mod.NEEDLES), name
        assert adapter.parse("no metrics here") is None


def test_ingest_lock_one_writer_and_each_callers_rule(tmp_path):
    """The ingest lock, taken in one place: while another holder has it, ingest skips its round, an eval result is
    appended anyway after its wait (one write), and a wait that ends in time gets the lock."""
    import fcntl
    import threading

    from rlctl.evals.loop import append_metrics
    from rlctl.metrics.stream import INGEST_LOCK, ingest, ingest_lock

    (tmp_path / "stdout.log").write_text("step:1 - actor/pg_loss:0.5\n")
    with open(tmp_path / INGEST_LOCK, "w") as other:
        fcntl.flock(other, fcntl.LOCK_EX)
        assert ingest(tmp_path, "verl") is None  # busy: this round is skipped, nothing half-written
        with ingest_lock(tmp_path, wait=0.2) as held:
            assert not held
        threading.Timer(0.3, lambda: fcntl.flock(other, fcntl.LOCK_UN)).start()
        with ingest_lock(tmp_path, wait=5) as held:
            assert held
    append_metrics(tmp_path, 2, {"eval/x/greedy_pass@1": 0.5})
    st = ingest(tmp_path, "verl")
    assert st is not None and st.records == 1
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2 and '"eval/x/greedy_pass@1"' in lines[0]


def test_metrics_of_a_key_no_run_has_is_a_usage_error_in_every_mode(tmp_path, monkeypatch):
    """`rlctl metrics RUN --keys nosuch` printed `nosuch=-` (and --csv a header) with exit 0, while --plot said exit
    2: a typo in a script passed silently. Every mode says it, exit 2, with the keys the runs log."""
    from rlctl.core.state import write_state
    from tests.conftest import run_cli

    monkeypatch.chdir(tmp_path)
    run = tmp_path / "runs" / "r-20261127-000000"
    run.mkdir(parents=True)
    write_state(run, status="finished")
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward/mean": s / 10, "kl": 0.01}) + "\n"
                                               for s in (1, 2)))
    for extra in ([], ["--csv"], ["--plot", str(tmp_path / "x.png")]):
        r = run_cli("metrics", run.name, "--keys", "nosuch", *extra)
        assert r.code == 2 and "no run has nosuch" in r.err and "kl, reward/mean" in r.err, (extra, r.out, r.err)
    r = run_cli("metrics", run.name, "--keys", "reward/mean,kl")
    assert r.code == 0 and "reward/mean=0.2@2" in r.out, r.out + r.err


def test_prune_with_keep_last_below_one_says_only_the_error(tmp_path, monkeypatch):
    """`ckpt prune RUN --keep-last 0` printed "keeping step N: the best eval ..." before refusing (exit 2)."""
    from rlctl.core.state import write_state
    from tests.conftest import run_cli

    monkeypatch.chdir(tmp_path)
    run = tmp_path / "runs" / "r-20261127-000000"
    (run / "checkpoints" / "checkpoint-2").mkdir(parents=True)
    (run / "checkpoints" / "checkpoint-2" / "trainer_state.json").write_text("{}")
    write_state(run, status="finished", backend="trl",
                best_checkpoint={"step": 2, "key": "eval/id/greedy_pass@1", "value": 0.5})
    for bad in ("0", "-1"):
        r = run_cli("ckpt", "prune", run.name, "--keep-last", bad, "--dry-run")
        assert r.code == 2 and "--keep-last" in r.err and "keeping" not in r.out + r.err, (r.out, r.err)


def test_ckpt_list_of_a_stopped_run_says_what_its_final_save_is(tmp_path, monkeypatch):
    """A run stopped at step 11 of 400 listed `final  complete` like a finished run's (new-user trial): said."""
    from rlctl.core.state import write_state
    from tests.conftest import run_cli

    monkeypatch.chdir(tmp_path)
    run = tmp_path / "runs" / "sr2-20261127-000000"
    (run / "checkpoints" / "checkpoint-10").mkdir(parents=True)
    (run / "checkpoints" / "checkpoint-10" / "trainer_state.json").write_text("{}")
    (run / "checkpoints" / "final").mkdir()
    (run / "checkpoints" / "final" / "model.safetensors").write_bytes(b"x")
    write_state(run, status="stopped", backend="trl", total_steps=400, attempts=[{"attempt": 1, "last_step": 11}])
    r = run_cli("ckpt", "list", run.name)
    assert r.code == 0 and "final" in r.out, r.out + r.err
    assert "stopped at step 11 of 400: its final save is the model then, not the end of its training" in r.out, r.out
