"""OpenRLHF's per-step lines in the order Ray delivers them: the actor's bar (PolicyModelActor) and the trainer's
`✨ Global step N` dict (PPOTrainer) come from two processes, forwarded separately, so a step's bar reaches the log
before or after its Global step line. Either way a run of N steps is N steps, with the Global dict's exact values
(a 6-step 0.10.4 run on 2 x H100 read `step 7 of 6`, kl rounded to the bar's 3 digits). The lines are made by the
release's own printing code (tests/fixtures/openrlhf/generate.py's readers of its source; its logger; tqdm)."""

from __future__ import annotations

import importlib.util
import io
import json
import logging

import pytest
from tqdm import tqdm

from rlctl.metrics.stream import METRICS, by_step, ingest, iter_metrics
from tests.conformance._openrlhf_support import wheel_root
from tests.conftest import FIXTURES
from tests.test_attach import released

ACTOR = "\x1b[36m(PolicyModelActor pid=5152)\x1b[0m "  # Ray's prefix, as the real run's log has it
TRAINER = "\x1b[36m(PPOTrainer pid=5331)\x1b[0m "
STEPS = 6


def _generate():
    spec = importlib.util.spec_from_file_location("openrlhf_generate", FIXTURES / "openrlhf/generate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def status(step: int) -> dict:
    """A step's status as the real run's `✨ Global step 6` printed it (its kl and entropy varied per step)."""
    return {"response_clip_ratio": 0.0, "return": 0.0, "group_reward_std": 0.0, "score": 0.0, "reward": 0.0,
            "ppo_kl": -0.00011211944123109181, "policy_loss": 0.0, "actor_grad_norm": 0.013847731985151768,
            "ppo_clip_ratio": 0.0, "logprobs_diff": 0.002108997665345669, "response_length": 96.0, "actor_lr": 1e-05,
            "entropy_loss": 11.752111752827963 - 0.001 * (STEPS - step),
            "kl": 0.00121568546940883 - 0.0001 * (STEPS - step), "truncated": 1.0, "total_length": 103.75,
            "timing/make_experience": 0.29221081733703613, "timing/ppo_train": 0.7483217716217041,
            "timing/generation": 0.41148996353149414, "timing/step_total": 2.7541699409484863}


class Printer:
    """What a release prints per step: the actor's `Train epoch [1/1]` bar (its `short_status` on the last
    micro-batch's status, drawn by tqdm, the final frame drawn again by close()) and the trainer's Global step line
    (its f-string through its own logger, where the release has one)."""

    def __init__(self, root):
        gen = _generate()
        self.gen, self.root = gen, root
        self.post, rel = gen.short_status_expr(root)
        self.extras = gen.short_status_extras(root, rel)
        self.global_line = gen.fstring(root, "Global step")
        self.buf = io.StringIO()
        mod = gen.load(root / "openrlhf/utils/logging_utils.py", f"openrlhf_logging_{id(self)}")
        self.logger = mod.init_logger(f"openrlhf.trainer.ppo_trainer.{id(self)}")  # a logger of each printer's own
        handler = logging.StreamHandler(self.buf)
        handler.setFormatter(mod.NewLineFormatter(mod._FORMAT, datefmt=mod._DATE_FORMAT))
        self.logger.handlers, self.logger.propagate = [handler], False

    def bar(self, step: int, epoch: int = 1, epochs: int = 1) -> str:
        last = {**status(step), "kl": status(step)["kl"] * (0.97 + 0.01 * epoch),
                "entropy_loss": status(step)["entropy_loss"] + 0.03 * epoch}
        out = io.StringIO()
        pbar = tqdm(range(4), desc=f"Train epoch [{epoch}/{epochs}]", file=out, mininterval=0, ascii=False)
        for _ in pbar:
            names = {"status": last, "merged_status": last, "actor_lr": last["actor_lr"]}
            short = self.gen.evaluate(self.post, names)
            for key, expr in self.extras:  # `short_status["ent_loss"] = merged_status["entropy_loss"]`
                short[key] = self.gen.evaluate(expr, names)
            pbar.set_postfix(short)
        pbar.close()
        return ACTOR + out.getvalue().rstrip("\n") + "\n"

    def global_step(self, step: int) -> str:
        self.logger.info(self.gen.evaluate(self.global_line, {"global_step": step, "log_status": status(step)}))
        text = self.buf.getvalue()
        self.buf.seek(0)
        self.buf.truncate()
        assert f"✨ Global step {step}: {{" in text, text
        return TRAINER + text


@pytest.fixture(scope="module")
def printer_0104():
    return Printer(wheel_root("0.10.4"))


def lines_in(printer: Printer, after: set[int]) -> list[tuple[int, str]]:
    """(step, line) of a 6-step run: each step's bar before its Global step line, or after it for steps in `after`."""
    out = []
    for step in range(1, STEPS + 1):
        pair = [printer.bar(step), printer.global_step(step)]
        out += [(step, line) for line in (reversed(pair) if step in after else pair)]
    return out


def _run(tmp_path, name="run"):
    run = tmp_path / name
    run.mkdir()
    return run


def _steps(run) -> list[int]:
    return [r["step"] for r in iter_metrics(run / METRICS)]


ORDERS = {"ray": {5, 6}, "global-first": set(range(1, STEPS + 1)), "bar-first": set(), "alternating": {2, 4, 6}}


@pytest.mark.parametrize("order", list(ORDERS))
def test_a_bar_after_its_global_step_line_is_no_step_of_its_own(order, printer_0104, tmp_path):
    """`Global step 5`, bar 5, `Global step 6`, bar 6 (as Ray delivered them), read as a run's log is read (the
    stream's state kept in .ingest.json between reads, one read per line), and the whole log read at once: steps 1..6,
    each step's values the Global dict's, never a step 7 or a rounded value on the next step."""
    lines = lines_in(printer_0104, ORDERS[order])
    bar6 = next(line for step, line in lines if step == 6 and "Train epoch" in line)
    assert "\rTrain epoch [1/1]: 100%|██████████| 4/4 [" in bar6 and "kl=0.00119" in bar6 and "ent_loss=11.8" in bar6
    follow, whole = _run(tmp_path, "follow"), _run(tmp_path, "whole")
    log = follow / "stdout.log"
    seen = 0
    for step, line in lines:
        with log.open("a") as fh:
            fh.write(line)
        ingest(follow, "openrlhf")
        seen = max(seen, step)
        assert max(_steps(follow)) == seen, (step, line[:120], _steps(follow))  # never ahead of the step printed
    (whole / "stdout.log").write_text("".join(line for _, line in lines))
    ingest(whole, "openrlhf", final=True)
    for run in (follow, whole):
        m = by_step(list(iter_metrics(run / METRICS)))
        assert sorted(m) == list(range(1, STEPS + 1)), _steps(run)
        assert all(_steps(run).count(step) == 1 for step in ORDERS[order]), _steps(run)  # the Global dict alone
        for step in range(1, STEPS + 1):  # the Global dict's exact values, not the bar's 3 digits
            assert m[step]["kl"] == status(step)["kl"] and m[step]["entropy"] == status(step)["entropy_loss"]
            assert m[step]["grad_norm"] == 0.013847731985151768
    assert m[6]["kl"] == 0.00121568546940883
    assert json.loads((follow / ".ingest.json").read_text())["stdout.log"]["last_step"] == STEPS


@pytest.mark.parametrize("order", ["G12", "1G2", "12G"])
def test_the_bars_of_max_epochs_2_in_any_order_around_the_global_step_line(order, printer_0104, tmp_path):
    """`--max_epochs 2`: two actor bars per step (`Train epoch [1/2]`, `[2/2]`: one process, in its order), the first
    counting the step, the second the step in progress, anywhere around the step's Global step line: steps 1..6,
    each with the Global dict's values."""
    run = _run(tmp_path)
    log = run / "stdout.log"
    for step in range(1, STEPS + 1):
        parts = {"1": printer_0104.bar(step, 1, 2), "2": printer_0104.bar(step, 2, 2),
                 "G": printer_0104.global_step(step)}
        for key in order:
            with log.open("a") as fh:
                fh.write(parts[key])
            ingest(run, "openrlhf")
            assert max(_steps(run)) == step, (step, key, _steps(run))
    m = by_step(list(iter_metrics(run / METRICS)))
    assert sorted(m) == list(range(1, STEPS + 1))
    assert all(m[s]["kl"] == status(s)["kl"] and m[s]["entropy"] == status(s)["entropy_loss"] for s in m), m


def test_status_of_the_finished_run_reads_step_6_of_6(printer_0104, user):
    """`rlctl status RUN` of the 6-step run whose last bar came after its Global step line: step 6 of 6, the last
    kl the Global dict's (was `"step": 7`, kl 0.00119)."""
    from rlctl.core.state import write_state

    work, rlctl = user
    run = work / "runs" / "openrlhf-2gpu-20261127-101009"
    run.mkdir(parents=True)
    (run / "stdout.log").write_text("".join(line for _, line in lines_in(printer_0104, {5, 6})))
    write_state(run, name=run.name, status="finished", backend="openrlhf", version="0.10.4", executor="ray",
                total_steps=6, optimizer_steps=6, exit_code=0, started_at=1795774209.2, ended_at=1795774450.5)
    r = rlctl("status", run.name, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert (d["step"], d["total_steps"]) == (6, 6), d
    assert d["metrics"]["kl"]["latest"] == 0.00121568546940883
    assert d["metrics"]["entropy"]["latest"] == 11.752111752827963
    r = rlctl("status", run.name)
    assert r.returncode == 0 and "step 6/6 " in r.stdout, r.stdout


def test_releases_without_a_global_step_line_count_steps_from_the_bar(tmp_path):
    """Up to 0.8.0 the actor's bar is the only per-step record while the run goes (the trainer's `Episode` bar is one
    line, ended only by its close()): each bar, read as it comes, is the next step; the Episode line at the end
    adds no step."""
    printer = Printer(released("openrlhf", "0.8.0"))
    assert printer.global_line is None  # 0.8.0 prints no Global step line
    run = _run(tmp_path)
    log = run / "stdout.log"
    for step in range(1, STEPS + 1):
        with log.open("a") as fh:
            fh.write(printer.bar(step))
        ingest(run, "openrlhf")
        assert _steps(run) == list(range(1, step + 1))
    episode = io.StringIO()
    pbar = tqdm(range(STEPS), desc="Episode [1/1]", file=episode, mininterval=0)
    for step in range(1, STEPS + 1):  # ppo_trainer.fit: set_postfix(status) before update()
        pbar.set_postfix(status(step))
        pbar.update()
    pbar.close()
    with log.open("a") as fh:
        fh.write(TRAINER + episode.getvalue())
    ingest(run, "openrlhf", final=True)
    m = by_step(list(iter_metrics(run / METRICS)))
    assert sorted(m) == list(range(1, STEPS + 1))
    assert m[3]["reward/mean"] == 0.0 and m[3]["openrlhf/ppo_kl"] == pytest.approx(-0.000112)


@pytest.mark.parametrize("after", [{5, 6}, set()], ids=["global-first", "bar-first"])
def test_a_restart_repeats_steps_without_a_step_beyond_them(after, printer_0104, tmp_path):
    """Attempt 1 ends after step 5 (its checkpoint: step 4); the supervisor sets the stream's count back to 4 and the
    floor to 5 (Supervisor._before_restart); attempt 2 repeats step 5, then 6, in Ray's order: steps 1..6, no 7."""
    from types import SimpleNamespace

    from rlctl.runs.supervisor import Supervisor

    run = _run(tmp_path)
    log = run / "stdout.log"
    lines = lines_in(printer_0104, {4, 5})
    log.write_text("".join(line for step, line in lines if step <= 5))
    ingest(run, "openrlhf", final=True)
    sup = SimpleNamespace(run_dir=run)
    Supervisor._set_floor(sup)
    Supervisor._reset_ingested_step(sup, 4)
    for step, line in lines_in(printer_0104, after):
        if step >= 5:
            with log.open("a") as fh:
                fh.write(line)
            ingest(run, "openrlhf")
            assert max(_steps(run)) <= 6, (step, line[:100], _steps(run))
    m = by_step(list(iter_metrics(run / METRICS)))
    assert sorted(m) == list(range(1, STEPS + 1)) and m[6]["kl"] == 0.00121568546940883


def test_a_bars_final_frame_drawn_again_by_close_is_one_step_not_two(tmp_path):
    """On the H100 (OpenRLHF 0.10.4 LoRA, docs/gpu/openrlhf-3.json) Ray wrote each frame of the actor's bar on a line
    of its own: the final frame (update) and the same frame drawn again by close() are two identical lines. The
    step's Global line never came (the weight sync after it failed); the log was read as `status 2/4`, step 2 a copy
    of step 1. The recorded lines: one step, as they come (one read per line) and read whole."""
    lines = (FIXTURES / "openrlhf" / "h100-lora-bar-close.log").read_text().splitlines(keepends=True)
    assert sum("Train epoch [1/1]: 100%" in line for line in lines) == 2 and lines[-1] == lines[-2]
    follow, whole = _run(tmp_path, "follow"), _run(tmp_path, "whole")
    for line in lines:
        with (follow / "stdout.log").open("a") as fh:
            fh.write(line)
        ingest(follow, "openrlhf")
    (whole / "stdout.log").write_text("".join(lines))
    ingest(whole, "openrlhf", final=True)
    for run in (follow, whole):
        recs = list(iter_metrics(run / METRICS))
        assert [r["step"] for r in recs] == [1], recs
        assert recs[0]["kl"] == 3.39e-5 and recs[0]["grad_norm"] == 0.000175


def test_a_repeated_final_frame_before_its_global_step_line_adds_no_step(printer_0104, tmp_path):
    """The same, a step's Global line following: bar frame, the frame again, Global step 1, ... for 6 steps, one line
    per frame as Ray writes them: steps 1..6, never a step ahead of the step printed."""
    run = _run(tmp_path)
    log = run / "stdout.log"
    for step in range(1, STEPS + 1):
        final = printer_0104.bar(step).split("\r")[-1].rstrip("\n") + "\n"
        for line in (final, final, printer_0104.global_step(step)):
            with log.open("a") as fh:
                fh.write(line)
            ingest(run, "openrlhf")
            assert max(_steps(run)) == step, (step, line[:100], _steps(run))
    assert sorted(by_step(list(iter_metrics(run / METRICS)))) == list(range(1, STEPS + 1))
