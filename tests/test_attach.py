"""`rlctl attach` on runs rlctl did not start, with logs made by each backend's own logging/printing code.

OpenRLHF's and verl's released wheels are fetched with `pip download --no-deps` (cached under
$RLCTL_TEST_WHEELS, default ~/.cache/rlctl-test-wheels) and their logging code is run on CPU with heavy imports
stubbed; TRL's console comes from the installed transformers' ProgressCallback, as TRL's trainer uses it.
"""

from __future__ import annotations

import contextlib
import http.server
import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import threading
import time
import types
import zipfile
from pathlib import Path

import pytest

from rlctl.metrics.stream import METRICS, by_step, iter_metrics
from tests.conftest import FIXTURES, RECIPES, run_cli

WHEELS = Path(os.environ.get("RLCTL_TEST_WHEELS", Path.home() / ".cache" / "rlctl-test-wheels"))


def released(dist: str, version: str) -> Path:
    """The purelib root of a released wheel, downloaded once and kept."""
    out = WHEELS / f"{dist}-{version}"
    if not (out / ".done").exists():
        WHEELS.mkdir(parents=True, exist_ok=True)
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(WHEELS),
                            f"{dist}=={version}"], capture_output=True, text=True, timeout=300)
        wheels = list(WHEELS.glob(f"{dist.replace('-', '_')}-{version}-*.whl"))
        if r.returncode != 0 or not wheels:
            pytest.skip(f"cannot download {dist}=={version}: {r.stderr.strip()[-200:]}")
        with zipfile.ZipFile(wheels[0]) as zf:
            zf.extractall(out)
        (out / ".done").touch()
    return next(out.glob("*.data/purelib"), out)


@pytest.fixture
def runs(tmp_path, monkeypatch):
    root = tmp_path / "runs"
    monkeypatch.setenv("RLCTL_RUNS_DIR", str(root))
    return root


def attach(*args: str):
    res = run_cli("attach", *args)
    m = re.search(r"attached (\S+) \((\w+)\)", res.out)
    return res, (Path(m.group(1)) if m else None), (m.group(2) if m else None)


def rlctl(*args: str) -> subprocess.CompletedProcess:
    """The real console script, for commands that write bytes to stdout (logs)."""
    return subprocess.run([sys.executable, "-m", "rlctl.cli", *args], capture_output=True, text=True, timeout=120)


def merged(run_dir: Path) -> dict[int, dict]:
    return by_step(list(iter_metrics(run_dir / METRICS)))


# ---- OpenRLHF -------------------------------------------------------------------------------------------------


def openrlhf_output(version: str, out: Path, *extra: str) -> Path:
    root = released("openrlhf", version)
    r = subprocess.run([sys.executable, str(FIXTURES / "openrlhf/generate.py"), str(root), version, str(out), *extra],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return out


@pytest.mark.parametrize("version", ["0.9.3", "0.11.2"])
def test_openrlhf_console_from_its_own_logger(version, runs, tmp_path):
    """Global step dicts (one wrapped over lines, one in colour, NaN/inf), tqdm bars with CR frames behind Ray
    prefixes, the eval line and a cut line: every step read, the cut line reported, grad norm of 0.11 mapped."""
    out = openrlhf_output(version, tmp_path / "out")
    ckpt = out / "ckpt" / "_actor"
    (ckpt / "global_step2").mkdir(parents=True)
    (ckpt / "global_step4").mkdir()
    (ckpt / "latest").write_text("global_step2")
    res, run, backend = attach(str(out), "--backend", "auto", "--name", "orl")
    assert res.code == 0, res.out + res.err
    assert backend == "openrlhf"
    assert "1 line(s) looked like metrics but were not understood" in res.out and "Global step 5" in res.out
    m = merged(run)
    assert sorted(m) == [1, 2, 3, 4]
    assert m[1]["policy_loss"] == pytest.approx(-0.01) and m[1]["lr"] == 5e-07 and m[1]["correctness"] == 0.25
    assert m[2]["reward/mean"] == pytest.approx(0.3)  # behind ANSI colours
    assert m[3]["response_length/mean"] == 1003.0 and m[3]["entropy"] == 0.47  # wrapped over five lines
    assert m[4]["kl"] is None and m[4]["entropy"] is None  # nan, inf
    assert m[4]["eval/aime/pass1"] == 0.3 and m[4]["eval/aime/pass8"] == 0.5
    assert m[2]["openrlhf/total_length"] == 1502.0
    if version == "0.11.2":
        assert m[3]["grad_norm"] == 3.5 and m[3]["time/step_s"] == 33.0 and m[3]["time/generation_s"] == 23.0

    # every command works on the attached run
    st = run_cli("status", "orl", "--json")
    assert st.code == 0 and json.loads(st.out)["step"] == 4, st.out + st.err
    lg = rlctl("logs", "orl", "--metrics")
    assert lg.returncode == 0 and len(lg.stdout.splitlines()) >= 4 and "not understood" in lg.stderr, lg.stderr
    assert run_cli("doctor", "orl", "--json").code in (0, 1)
    ck = run_cli("ckpt", "list", "orl", "--json")
    steps = [(c["step"], c["complete"]) for c in json.loads(ck.out)["checkpoints"]]
    assert steps == [(2, True), (4, False)], ck.out
    pytest.importorskip("matplotlib")
    pl = run_cli("metrics", "orl", "--plot", str(tmp_path / "c.png"), "--keys", "reward/mean,kl")
    assert pl.code == 0 and (tmp_path / "c.png").stat().st_size > 0, pl.err


def test_openrlhf_06_progress_bars_only(runs, tmp_path):
    """Before the Global step line existed (0.6): the actor's `pg=, rm=, ret=, glen=, tlen=, kl=, act_lr=` bars
    (counted steps) and the Episode bar's status postfix (its own step)."""
    out = openrlhf_output("0.6.0", tmp_path / "out")
    res, run, backend = attach(str(out / "train.log"))
    assert res.code == 0 and backend == "openrlhf", res.out + res.err
    m = merged(run)
    assert sorted(m) == [1, 2, 3, 4]
    assert m[2]["policy_loss"] == pytest.approx(-0.02) and m[2]["reward/mean"] == pytest.approx(0.3)
    assert m[3]["lr"] == 1.5e-06 and m[1]["openrlhf/return"] == 0.1 and m[4]["kl"] is None
    assert m[3]["correctness"] == 0.75  # only the Episode bar has it


def test_openrlhf_tensorboard_and_wandb_are_read_exactly(runs, tmp_path):
    """OpenRLHF's own TensorboardLogger (torch's SummaryWriter) and WandbLogger (offline): values as logged."""
    pytest.importorskip("tensorboard")
    pytest.importorskip("wandb")
    pytest.importorskip("torch")
    out = openrlhf_output("0.11.2", tmp_path / "out", "--tensorboard", "--wandb")
    (out / "train.log").unlink()  # only the second sources
    assert list(out.rglob("events.out.tfevents.*")) and list(out.rglob("*.wandb"))
    res, run, backend = attach(str(out))
    assert res.code == 0 and backend == "openrlhf", res.out + res.err
    m = merged(run)
    assert sorted(m) == [1, 2, 3, 4]
    assert m[2]["reward/mean"] == pytest.approx(0.3) and m[3]["grad_norm"] == 3.5 and m[1]["lr"] == 5e-07
    assert m[4]["kl"] is None  # NaN logged to W&B
    assert m[4]["eval/aime/pass1"] == 0.3
    for name in ("tensorboard", "wandb"):  # each source on its own
        from rlctl.runs.attach import find_sources, structured_rows

        src = find_sources(out)
        if name == "tensorboard":
            src.wandb = []
        else:
            src.tensorboard = []
        rows = [r for rs in structured_rows(src).values() for r in rs]
        assert any(r.get("train/reward") == 0.2 for r in rows), (name, rows[:2])


# ---- verl -----------------------------------------------------------------------------------------------------


def verl_console(version: str, data: list[tuple[int, dict]]) -> str:
    """verl's LocalLogger (aggregate_logger.py of the release) printing each step; torch stubbed."""
    path = released("verl", version) / "verl/utils/logger/aggregate_logger.py"
    spec = importlib.util.spec_from_file_location(f"verl_aggregate_logger_{version.replace('.', '_')}", path)
    mod = importlib.util.module_from_spec(spec)
    saved = sys.modules.get("torch")
    sys.modules["torch"] = types.ModuleType("torch")  # imported at the top, unused by the printer
    try:
        spec.loader.exec_module(mod)
    finally:
        if saved is None:
            sys.modules.pop("torch", None)
        else:
            sys.modules["torch"] = saved
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        logger = mod.LocalLogger(print_to_console=True) if "print_to_console" in str(
            mod.LocalLogger.__init__.__code__.co_varnames) else mod.LocalLogger()
        for step, d in data:
            logger.log(data=d, step=step)
    return buf.getvalue()


def test_openrlhf_in_loop_evals_named_by_the_recipe(runs, tmp_path):
    """attach --recipe: the recipe's render says what the in-loop eval ran, so its metrics are eval/<set>/<mode>
    (issue 24); without a recipe the backend's names stay (the test above)."""
    out = openrlhf_output("0.9.3", tmp_path / "out")  # its eval: eval_aime_pass1 0.3, eval_aime_pass8 0.5
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'extends = "{RECIPES / "openrlhf-gpt-oss-20b-grpo-lora-8xh100.toml"}"\n'
                      "[eval]\ntemperature = 0.6\nn_samples = 8\n")
    res, run, _ = attach(str(out), "--backend", "openrlhf", "--name", "orl-r", "--recipe", str(recipe))
    assert res.code == 0, res.out + res.err
    ev = {k: v for k, v in merged(run)[4].items() if k.startswith("eval/")}
    assert ev == {"eval/default/sampling_pass@8": 0.5, "eval/default/sampling_pass@8/mean_correct": 0.3}

@pytest.mark.parametrize("version", ["0.2.0.post2", "0.4.1", "0.9.1"])
def test_verl_console_from_its_own_logger(version, runs, tmp_path):
    np = pytest.importorskip("numpy")
    data = [
        (1, {"actor/pg_loss": np.float64(0.013), "actor/entropy_loss": np.float64(1.25), "critic/kl": 0.002,
             "critic/score/mean": np.float32(0.5), "actor/grad_norm": 0.3, "timing_s/step": 41.5}),
        (2, {"actor/pg_loss": -0.02, "actor/entropy": 1.1, "actor/entropy_loss": 1.2, "actor/kl_loss": 0.004,
             "critic/kl": 0.001, "critic/score/mean": 0.625, "actor/grad_norm": float("nan"),
             "val-core/openai/gsm8k/acc/mean@1": 0.51}),
    ]
    text = verl_console(version, data)
    lines = ["(TaskRunner pid=9, ip=10.0.0.3) " + line for line in text.splitlines()]
    lines[1] += " -"  # as pasted from a terminal
    log = tmp_path / "verl.out"
    log.write_text("\n".join(lines) + "\n")
    res, run, backend = attach(str(log))
    assert res.code == 0 and backend == "verl", res.out + res.err
    m = merged(run)
    assert m[1]["entropy"] == pytest.approx(1.25) and m[1]["kl"] == pytest.approx(0.002)  # older names
    assert m[1]["reward/mean"] == pytest.approx(0.5) and m[1]["time/step_s"] == pytest.approx(41.5)
    assert m[2]["entropy"] == pytest.approx(1.1) and m[2]["kl"] == pytest.approx(0.004)  # newer names win
    assert m[2]["verl/actor/entropy_loss"] == pytest.approx(1.2) and m[2]["verl/critic/kl"] == pytest.approx(0.001)
    assert m[2]["grad_norm"] is None and m[2]["eval/openai/gsm8k/acc/mean@1"] == pytest.approx(0.51)
    assert all(isinstance(v, (int, float)) or v is None for v in m[2].values())  # no "0.625 -" strings


def test_verl_file_logger_and_tensorboard(runs, tmp_path, monkeypatch):
    """verl's own FileLogger (JSON lines) and _TensorboardAdapter (torch's SummaryWriter) from the 0.9.1 wheel."""
    pytest.importorskip("orjson")
    pytest.importorskip("tensorboard")
    pytest.importorskip("torch")
    path = released("verl", "0.9.1") / "verl/utils/tracking.py"
    spec = importlib.util.spec_from_file_location("verl_tracking_0_9_1", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "verl-out"
    out.mkdir()
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(out / "metrics.jsonl"))
    monkeypatch.setenv("TENSORBOARD_DIR", str(out / "tb"))
    loggers = [mod.FileLogger("p", "e"), mod._TensorboardAdapter("p", "e")]
    for step in (1, 2, 3):
        data = {"actor/pg_loss": 0.01 * step, "critic/score/mean": 0.25 * step, "actor/entropy": 1.5 - 0.1 * step,
                "timing_s/step": 40.0 + step}
        for lg in loggers:
            lg.log(data, step)
    for lg in loggers:
        lg.finish()
    res, run, backend = attach(str(out))
    assert res.code == 0 and backend == "verl", res.out + res.err
    m = merged(run)
    assert sorted(m) == [1, 2, 3]
    assert m[2]["reward/mean"] == 0.5 and m[3]["policy_loss"] == pytest.approx(0.03) and m[1]["time/step_s"] == 41.0
    assert "3 from TensorBoard" in res.out and "3 from 3 log lines" in res.out


# ---- TRL ------------------------------------------------------------------------------------------------------


def trl_console(logs: list[dict], summary: dict) -> str:
    """transformers' ProgressCallback (what TRL's GRPOTrainer prints through) for these log dicts."""
    tc = pytest.importorskip("transformers.trainer_callback")
    args = types.SimpleNamespace()
    state = tc.TrainerState(max_steps=len(logs), is_world_process_zero=True, is_local_process_zero=True)
    control = tc.TrainerControl()
    cb = tc.ProgressCallback()
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        cb.on_train_begin(args, state, control)
        for i, logs_i in enumerate(logs, 1):
            state.global_step = i
            cb.on_step_end(args, state, control)
            cb.on_log(args, state, control, logs=dict(logs_i))
        cb.on_log(args, state, control, logs={"eval_loss": 0.5, "eval_reward": 0.75, "epoch": 1.0})
        cb.on_log(args, state, control, logs=dict(summary))
        cb.on_train_end(args, state, control)
    return buf.getvalue()


def test_trl_console_without_step_gets_counted_steps(runs, tmp_path):
    logs = [{"loss": 0.01 * i, "grad_norm": 0.5, "learning_rate": 1e-05 * i, "num_tokens": 1000.0 * i,
             "completions/mean_length": 12.5 + i, "completions/clipped_ratio": 0.0, "rewards/frac_a/mean": 0.1 * i,
             "reward": 0.1 * i, "reward_std": 0.05, "frac_reward_zero_std": 0.0, "kl": 0.001 * i,
             "entropy": 3.2, "clip_ratio/region_mean": 0.0, "epoch": 0.2 * i} for i in range(1, 6)]
    logs[2]["loss"] = float("nan")
    text = trl_console(logs, {"train_runtime": 12.5, "train_samples_per_second": 3.2, "train_loss": 0.02,
                              "epoch": 1.0})
    assert "'step'" not in text
    log = tmp_path / "trl.log"
    log.write_text(text)
    res, run, backend = attach(str(log), "--backend", "trl")
    assert res.code == 0 and backend == "trl", res.out + res.err
    m = merged(run)
    assert sorted(m) == [1, 2, 3, 4, 5]
    assert m[2]["reward/mean"] == pytest.approx(0.2) and m[5]["lr"] == pytest.approx(5e-05)
    assert m[3]["policy_loss"] is None and m[4]["response_length/mean"] == 16.5
    assert m[5]["eval/default/reward"] == 0.75 and m[5]["trl/train_runtime"] == 12.5  # the step in progress
    auto, _, found = attach(str(log))
    assert found == "trl", auto.out + auto.err
    assert "backend guessed from the logs: trl" in auto.out  # auto is a guess, and says so


def test_trl_tensorboard_from_transformers_callback(runs, tmp_path, monkeypatch):
    """transformers' TensorBoardCallback (what a TRL run with report_to=tensorboard uses): `train/<key>` tags at
    the global step, `eval/<key>` for evals."""
    pytest.importorskip("tensorboard")
    pytest.importorskip("torch")
    integ = pytest.importorskip("transformers.integrations.integration_utils")
    tc = pytest.importorskip("transformers.trainer_callback")
    out = tmp_path / "trl-tb"
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(out / "runs"))
    args = types.SimpleNamespace(output_dir=str(out), to_json_string=lambda: "{}")
    state = tc.TrainerState(max_steps=3, is_world_process_zero=True, is_local_process_zero=True)
    cb = integ.TensorBoardCallback()
    cb.on_train_begin(args, state, tc.TrainerControl())
    for step in (1, 2, 3):
        state.global_step = step
        cb.on_log(args, state, tc.TrainerControl(), logs={"loss": 0.5 / step, "reward": 0.25 * step,
                                                          "learning_rate": 1e-05, "kl": 0.001 * step, "epoch": step})
    cb.on_log(args, state, tc.TrainerControl(), logs={"eval_reward": 0.625})
    cb.on_train_end(args, state, tc.TrainerControl())
    res, run, backend = attach(str(out))
    assert res.code == 0 and backend == "trl", res.out + res.err
    m = merged(run)
    assert sorted(m) == [1, 2, 3]
    assert m[2]["reward/mean"] == 0.5 and m[3]["kl"] == 0.003 and m[1]["policy_loss"] == 0.5 and m[1]["lr"] == 1e-05
    assert m[3]["eval/default/reward"] == 0.625


def test_trl_output_dir_with_checkpoints_and_trainer_state(runs, tmp_path):
    out = tmp_path / "trl-out"
    state = json.loads((FIXTURES / "trl/trainer_state.json").read_text())
    for step in (20, 40):
        d = out / f"checkpoint-{step}"
        d.mkdir(parents=True)
        part = {**state, "log_history": [e for e in state["log_history"] if e.get("step", 0) <= step]}
        (d / "trainer_state.json").write_text(json.dumps(part))
    res, run, backend = attach(str(out), "--name", "trl-out")
    assert res.code == 0 and backend == "trl", res.out + res.err
    assert sorted(merged(run))[-1] == 40 and "40 from TensorBoard/W&B/trainer state" in res.out
    ck = json.loads(run_cli("ckpt", "list", "trl-out", "--json").out)["checkpoints"]
    assert [c["step"] for c in ck] == [20, 40] and all(c["complete"] for c in ck)


@pytest.mark.parametrize("fixture,backend,steps", [
    ("openrlhf/console-0.6.0.log", "openrlhf", [1, 2, 3, 4]),
    ("openrlhf/console-0.9.3.log", "openrlhf", [1, 2, 3, 4]),
    ("openrlhf/console-0.11.2.log", "openrlhf", [1, 2, 3, 4]),
    ("verl/console-0.2.0.post2.log", "verl", [1, 2]),
    ("verl/console-0.4.1.log", "verl", [1, 2]),
    ("verl/console-0.9.1.log", "verl", [1, 2]),
    ("trl/console-no-step.log", "trl", [1, 2, 3, 4, 5]),
])
def test_committed_fixtures_attach_offline(fixture, backend, steps, runs):
    """The same outputs, generated once by the backends' own code (tests/fixtures/openrlhf/generate.py and the
    helpers above) and committed, so the formats stay covered without network."""
    res, run, found = attach(str(FIXTURES / fixture))
    assert res.code == 0 and found == backend, res.out + res.err
    assert sorted(merged(run)) == steps


@pytest.mark.parametrize("release", ["v0.3.0", "v0.8.0", "v0.8.0-json"])
def test_prime_rl_orchestrator_and_trainer_logs_of_a_directory(release, runs, tmp_path):
    """prime-rl's two logs, printed by its own loguru logger and step-message f-strings of the tag
    (tests/fixtures/prime_rl/generate.py; prime-rl is not on PyPI): one run, merged per step."""
    out = tmp_path / "prime-out"
    out.mkdir()
    for part in ("orchestrator", "trainer"):
        (out / f"{part}.log").write_bytes((FIXTURES / f"prime_rl/{part}-{release}.log").read_bytes())
    res, run, backend = attach(str(out))
    assert res.code == 0 and backend == "prime_rl", res.out + res.err
    assert "not understood" not in res.out
    m = merged(run)
    assert sorted(m) == [1, 2, 3]
    assert m[2]["reward/mean"] == 0.35 and m[2]["policy_loss"] == 0.005 and m[2]["grad_norm"] == 0.27
    assert m[3]["lr"] == 1e-05 and m[3]["entropy"] == 0.47 and m[1]["time/train_s"] == 41.5
    if release.startswith("v0.8"):
        assert m[1]["time/generation_s"] == 71.0 and m[1]["response_length/clip_ratio"] == pytest.approx(0.031)
    else:
        assert m[1]["time/generation_s"] == 71.0 and m[1]["throughput/tokens_per_s"] == 2401.5


def _attach_v08_orchestrator(tmp_path, variant: str) -> dict:
    """Attach an output directory holding the v0.8.0 orchestrator fixture `variant` and the matching trainer log
    (JSON logging where the variant is); every line understood; the merged metrics by step."""
    out = tmp_path / "prime-out"
    out.mkdir()
    (out / "orchestrator.log").write_bytes((FIXTURES / f"prime_rl/orchestrator-v0.8.0-{variant}.log").read_bytes())
    trainer = "trainer-v0.8.0-json.log" if variant.endswith("json") else "trainer-v0.8.0.log"
    (out / "trainer.log").write_bytes((FIXTURES / f"prime_rl/{trainer}").read_bytes())
    res, run, backend = attach(str(out))
    assert res.code == 0 and backend == "prime_rl", res.out + res.err
    assert "not understood" not in res.out
    return merged(run)


@pytest.mark.parametrize("variant", ["multienv", "multienv-json"])
def test_prime_rl_per_environment_lines(variant, runs, tmp_path):
    """A multi-environment v0.8.0 run: its orchestrator's `╰─ env | Ratio .. | Reward ..` lines, printed under each
    step line by the release's own f-string and separator (generate.py), become env/<name>/<metric> of that step."""
    m = _attach_v08_orchestrator(tmp_path, variant)
    assert sorted(m) == [1, 2, 3]
    for step in (1, 2, 3):
        assert m[step]["reward/mean"] == pytest.approx(0.25 + 0.05 * step)  # the step line still stands
        assert m[step]["env/math/reward/mean"] == pytest.approx(0.1 + 0.05 * step)
        assert m[step]["env/reverse-text/reward/mean"] == pytest.approx(0.2 + 0.05 * step)
    assert m[2]["env/math/ratio"] == 40.0 and m[2]["env/reverse-text/ratio"] == 60.0  # percentages stay
    assert m[2]["env/math/response_length/clip_ratio"] == pytest.approx(0.062)  # Truncation 6.2% -> a fraction
    assert m[2]["env/reverse-text/response_length/clip_ratio"] == 0.0
    assert m[3]["env/math/turns"] == 1.0 and m[3]["env/math/branches"] == 1.0
    assert m[3]["env/math/max_off_policy"] == 1 and m[3]["env/math/error"] == 0.0
    assert m[1]["policy_loss"] == 0.01  # the trainer's line of the same step
    assert not [k for k in m[1] if k.startswith("prime_rl/") and "reverse" in k]  # no env line read as a step


@pytest.mark.parametrize("variant", ["eval", "eval-json"])
def test_prime_rl_eval_lines(variant, runs, tmp_path):
    """v0.8.0's online evals: `Evaluated <env> (Step N) | Policy vN | <time> | Reward .. | ...`, printed by the
    release's own f-string (generate.py) after the next step's line, become eval/<env>/<metric> of step N."""
    m = _attach_v08_orchestrator(tmp_path, variant)
    assert sorted(m) == [1, 2, 3]
    for step in (1, 2):  # logged during step N+1, read at the step the line names
        assert m[step]["eval/aime/reward"] == pytest.approx(0.5 + 0.1 * step)
        assert m[step]["eval/gsm8k/reward"] == pytest.approx(0.7 + 0.1 * step)
        assert m[step]["prime_rl/eval/aime/policy_version"] == step
        assert m[step]["prime_rl/eval/gsm8k/time_s"] == 20.0 + step
        assert m[step]["reward/mean"] == pytest.approx(0.25 + 0.05 * step)  # the step line still stands
    assert not [k for k in m[3] if k.startswith("eval/")]
    assert m[1]["eval/aime/response_length/clip_ratio"] == 0.125 and m[1]["eval/gsm8k/response_length/clip_ratio"] == 0
    assert m[2]["eval/gsm8k/error"] == 6.2 and m[2]["eval/aime/turns"] == 1.0 and m[2]["eval/aime/branches"] == 1.0
    assert m[2]["policy_loss"] == 0.005  # the trainer's line of the same step


# ---- nothing silent -------------------------------------------------------------------------------------------


def test_a_log_with_no_record_fails_and_says_why(runs, tmp_path):
    log = tmp_path / "broken.log"
    log.write_text("step:1 - actor/pg_loss\nstep:2 - critic/score/mean\nsomething else\n")
    res, run, _ = attach(str(log), "--backend", "verl", "--name", "broken")
    assert res.code == 1
    assert "2 line(s) looked like metrics but were not understood" in res.out and "line 1: step:1" in res.out
    lg = rlctl("logs", "broken", "--metrics")
    assert lg.returncode == 1 and "not understood" in lg.stderr and "gave no metrics record" in lg.stderr
    unknown = tmp_path / "plain.log"
    unknown.write_text("hello\nworld\n")
    assert attach(str(unknown))[0].code == 1  # no adapter understands it: said, non-zero


def test_unknown_path_is_a_clear_error(runs, tmp_path):
    res, _, _ = attach(str(tmp_path / "nope.log"))
    assert res.code == 2 and "no such file" in res.err


# ---- following and Ray jobs -----------------------------------------------------------------------------------


def test_follow_reads_a_growing_log(runs, tmp_path):
    log = tmp_path / "grow.log"
    log.write_text("step:1 - critic/score/mean:0.1\n")

    def grow():
        for i in range(2, 5):
            time.sleep(0.4)
            with log.open("a") as fh:
                fh.write(f"step:{i} - critic/score/mean:0.{i}\n")

    t = threading.Thread(target=grow)
    t.start()
    res, run, _ = attach(str(log), "--backend", "verl", "--follow", "--idle-exit", "1.5", "--name", "grow")
    t.join()
    assert res.code == 0, res.out + res.err
    assert sorted(merged(run)) == [1, 2, 3, 4]
    assert json.loads((run / "state.json").read_text())["status"] == "attached"


class _FakeDashboard(http.server.BaseHTTPRequestHandler):
    log_text = (FIXTURES / "verl/console.log").read_text()

    def do_GET(self):  # noqa: N802 - http.server's name
        if self.path.endswith("/logs"):
            body = {"logs": self.log_text}
        elif self.path.startswith("/api/jobs/raysubmit_abc"):
            body = {"status": "SUCCEEDED", "submission_id": "raysubmit_abc"}
        else:
            self.send_response(404)
            self.end_headers()
            return
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_attach_a_ray_job_by_id(runs, tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeDashboard)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        address = f"http://127.0.0.1:{server.server_address[1]}"
        res, run, backend = attach("raysubmit_abc", "--address", address)
    finally:
        server.shutdown()
    assert backend == "verl", res.out + res.err
    state = json.loads((run / "state.json").read_text())
    assert state["ray_job_id"] == "raysubmit_abc" and state["status"] == "finished"
    assert sorted(merged(run)) == [0, 1, 2, 3, 4, 5]


class _GrowingJob(_FakeDashboard):
    """A job that runs for a few status calls, logging one more step each time, then succeeds."""

    calls = 0

    def do_GET(self):  # noqa: N802
        if self.path.endswith("/logs"):
            n = min(type(self).calls, 4)
            body = {"logs": "".join(f"step:{i} - critic/score/mean:0.{i}\n" for i in range(1, n + 1))}
        elif self.path.startswith("/api/jobs/raysubmit_run"):
            type(self).calls += 1
            body = {"status": "RUNNING" if type(self).calls < 5 else "SUCCEEDED"}
        else:
            self.send_response(404)
            self.end_headers()
            return
        data = json.dumps(body).encode()
        self.send_response(200)
        self.end_headers()
        self.wfile.write(data)


def test_follow_a_running_ray_job_until_it_ends(runs):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _GrowingJob)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        address = f"http://127.0.0.1:{server.server_address[1]}"
        res, run, backend = attach("raysubmit_run", "--address", address, "--backend", "verl", "--follow")
    finally:
        server.shutdown()
    assert res.code == 0 and backend == "verl", res.out + res.err
    assert sorted(merged(run)) == [1, 2, 3, 4]
    assert json.loads((run / "state.json").read_text())["status"] == "finished"


# ---- a custom trainer's JSONL log (seed 003's train_log.jsonl) ----------------------------------------------------
CUSTOM_RECIPE = """
[backend]
name = "command"
[backend.command]
command = ["python", "train.py"]
metrics_map = {avg_reward = "reward/mean", loss = "policy_loss"}
step_key = "iteration"
[model]
path = "random:qwen2?hidden=64&layers=2"
[data]
train = "gsm8k"
"""


def _custom_log(tmp_path: Path, step_key: str = "step") -> Path:
    log = tmp_path / "training_runs" / "run_1" / "logs" / "train_log.jsonl"
    log.parent.mkdir(parents=True)
    log.write_text("".join(json.dumps({step_key: s, "avg_reward": 0.1 * s, "loss": 1.0 / s, "kl": 0.01,
                                       "gen": {"len": 100 + s}}) + "\n" for s in range(1, 6)))
    return log


def test_auto_never_claims_a_backend_for_a_custom_jsonl_log(runs, tmp_path):
    """No adapter recognises a custom trainer's keys: none is claimed (verl once took it, every key under verl/*);
    the generic JSON-lines reader takes it and says so."""
    res, run, backend = attach(str(_custom_log(tmp_path)), "--name", "custom")
    assert res.code == 0, res.out + res.err
    assert backend == "command" and "no backend adapter recognises these logs" in res.out, res.out
    m = merged(run)
    assert sorted(m) == [1, 2, 3, 4, 5]
    assert m[5]["command/avg_reward"] == pytest.approx(0.5) and m[5]["command/gen/len"] == 105
    assert not any(k.startswith(("verl/", "openrlhf/", "prime_rl/", "trl/")) for rec in m.values() for k in rec)


def test_attach_command_takes_the_recipes_metrics_map(runs, tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text(CUSTOM_RECIPE)
    log = _custom_log(tmp_path, step_key="iteration")
    res, run, backend = attach(str(log), "--recipe", str(recipe), "--name", "rec")
    assert res.code == 0 and backend == "command", res.out + res.err
    m = merged(run)
    assert sorted(m) == [1, 2, 3, 4, 5]  # the recipe's step_key
    assert m[2]["reward/mean"] == pytest.approx(0.2) and m[2]["policy_loss"] == 0.5 and m[2]["command/kl"] == 0.01
    # an explicit map on top of the recipe's, and on its own
    res, run, _ = attach(str(log), "--recipe", str(recipe), "--metrics-map", "kl=kl", "--name", "rec2")
    assert res.code == 0 and merged(run)[2]["kl"] == 0.01, res.out + res.err
    res, run, backend = attach(str(_custom_log(tmp_path / "b")), "--backend", "command", "--metrics-map",
                               "loss=policy_loss, avg_reward=reward/mean", "--name", "map")
    assert res.code == 0 and backend == "command", res.out + res.err
    assert merged(run)[4]["reward/mean"] == pytest.approx(0.4) and merged(run)[4]["policy_loss"] == 0.25
    assert "guessed" not in res.out  # told, not guessed


@pytest.mark.parametrize(("args", "message"), [
    (("--backend", "command", "--metrics-map", "loss=polcy_loss"), "Did you mean policy_loss"),
    (("--backend", "command", "--metrics-map", "loss"), "'loss' is not key=name"),
    (("--backend", "trl", "--metrics-map", "loss=policy_loss"), "takes no metrics map"),
])
def test_bad_metrics_map_is_a_usage_error(runs, tmp_path, args, message):
    res = run_cli("attach", str(_custom_log(tmp_path)), *args)
    assert res.code == 2 and message in res.err, res.out + res.err
    assert "Traceback" not in res.err
