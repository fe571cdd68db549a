"""The LR schedules rlctl computes, against the real implementations, to 1e-9 relative."""

from __future__ import annotations

import ast
import math

import pytest

from rlctl.backends.prime_rl.schedule import prime_rl_schedule
from rlctl.backends.verl import VerlBackend
from rlctl.backends.verl.schedule import verl_schedule
from rlctl.estimate.schedules import hf_schedule, sparkline
from rlctl.recipe.planning import prepare
from tests.conftest import RECIPES

torch = pytest.importorskip("torch")
VERL_VERSIONS = VerlBackend.known_versions
transformers = pytest.importorskip("transformers")


def _run(scheduler, optimizer, n):
    out = []
    for _ in range(n):
        out.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return out


def _opt(lr):
    p = torch.nn.Parameter(torch.zeros(1))
    return torch.optim.SGD([p], lr=lr)


def close(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-18), (x, y)


@pytest.mark.parametrize("total,warmup", [(1, 0), (7, 1), (100, 5), (250, 13), (40, 40)])
@pytest.mark.parametrize("name", ["cosine_with_min_lr", "cosine", "linear", "constant_with_warmup"])
def test_hf_schedules_match_transformers(name, total, warmup):
    from transformers import get_scheduler

    lr = 5e-7
    opt = _opt(lr)
    kw = {"scheduler_specific_kwargs": {"min_lr": lr * 0.1}} if name == "cosine_with_min_lr" else {}
    sched = get_scheduler(name, opt, num_warmup_steps=warmup, num_training_steps=total, **kw)
    close(hf_schedule(name, lr, warmup, total, 0.1), _run(sched, opt, total))


@pytest.mark.parametrize("version", VERL_VERSIONS)
@pytest.mark.parametrize("kind", ["constant", "cosine"])
@pytest.mark.parametrize("total,warmup,min_ratio", [(220, 0, 0.0), (100, 10, 0.1), (33, 5, 0.0)])
def test_verl_schedules_match_verl_source(version, kind, total, warmup, min_ratio):
    """Run verl's own scheduler functions, taken from each known release's wheel (cached by the conformance suite,
    which also runs them through the FSDP engine's _build_lr_scheduler: tests/conformance/test_verl.py)."""
    from tests.conformance._verl_support import verl_root

    try:
        root = verl_root(version)
    except RuntimeError as e:
        pytest.skip(str(e))
    src = (root / "verl/utils/torch_functional.py").read_text()
    tree = ast.parse(src)
    wanted = {"get_cosine_schedule_with_warmup", "get_constant_schedule_with_warmup"}
    funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    ns = {"math": math, "LambdaLR": torch.optim.lr_scheduler.LambdaLR, "Optimizer": torch.optim.Optimizer}
    exec(compile(ast.Module(body=funcs, type_ignores=[]), "verl_torch_functional", "exec"), ns)
    lr = 1e-6
    opt = _opt(lr)
    if kind == "cosine":
        sched = ns["get_cosine_schedule_with_warmup"](opt, warmup, total, min_lr_ratio=min_ratio)
    else:
        sched = ns["get_constant_schedule_with_warmup"](opt, warmup)
    close(verl_schedule(kind, lr, warmup, total, min_ratio), _run(sched, opt, total))


def _prime_rl_torch(kind, lr, warmup, total, min_lr, decay=0):
    """prime-rl's trainer/scheduler.py composition of torch schedulers (v0.3.0 and v0.8.0)."""
    from torch.optim.lr_scheduler import ConstantLR, CosineAnnealingLR, LinearLR, SequentialLR

    opt = _opt(lr)
    f = min_lr / lr if min_lr > 0 else 1e-8
    if kind == "constant":
        return _run(ConstantLR(opt, factor=1.0), opt, total)
    scheds, miles = [], []
    if warmup > 0:
        scheds.append(LinearLR(opt, start_factor=f, end_factor=1.0, total_iters=warmup))
        miles.append(warmup)
    if kind == "cosine":
        scheds.append(CosineAnnealingLR(opt, T_max=total - warmup, eta_min=min_lr))
    else:
        start = total - decay
        scheds.append(LinearLR(opt, start_factor=1.0, end_factor=1.0, total_iters=start - warmup))
        scheds.append(LinearLR(opt, start_factor=1.0, end_factor=f, total_iters=decay - 1))
        miles.append(start)
    s = scheds[0] if len(scheds) == 1 else SequentialLR(opt, scheds, milestones=miles)
    return _run(s, opt, total)


@pytest.mark.parametrize("kind,total,warmup,min_lr,decay", [
    ("constant", 50, 0, 0.0, 0), ("cosine", 100, 10, 1e-6, 0), ("cosine", 60, 0, 0.0, 0),
    ("linear", 80, 10, 1e-6, 30),
])
def test_prime_rl_schedules_match_torch(kind, total, warmup, min_lr, decay):
    lr = 1e-5
    close(prime_rl_schedule(kind, lr, warmup, total, min_lr, decay), _prime_rl_torch(kind, lr, warmup, total, min_lr,
                                                                                      decay))


def test_openrlhf_total_steps_and_schedule_follow_its_formula(tmp_path):
    """OpenRLHF: max_steps = len(prompts) * n // train_batch_size * episodes * max_epochs, warmup = ceil(ratio*max)."""
    data = tmp_path / "pool.jsonl"
    data.write_text("".join(f'{{"input": "q{i}", "label": "1"}}\n' for i in range(400)))
    prep = prepare(RECIPES / "openrlhf-gpt-oss-20b-grpo-lora-8xh100.toml",
                   [f'data.train="{data}"', "train.episodes=1"])
    assert prep.dataset_size == 400
    total = 400 * 8 // 16 * 1 * 1
    assert prep.plan.total_steps == total == 200
    lrs = prep.backend.schedule(prep.recipe, 400)
    warm = math.ceil(total * 0.05)
    assert lrs[0] == 0.0  # transformers' warmup starts at 0
    assert math.isclose(lrs[warm], 5e-7, rel_tol=1e-9)
    assert math.isclose(lrs[-1], hf_schedule("cosine_with_min_lr", 5e-7, warm, total, 0.1)[-1], rel_tol=1e-12)


def test_sparkline_shape():
    assert sparkline([0, 1, 2, 3], width=4) == "▁▃▅█"
    assert sparkline([]) == ""
    assert len(sparkline(list(range(1000)), width=40)) == 40


def test_sparkline_shows_every_step_and_the_newest():
    """Fewer steps than the width: each step once, in order (status once showed the first half twice over);
    more: the last character is always the newest value."""
    line = sparkline([1.0, 2.0, 3.0, 4.0, 5.0], width=20)
    assert len(line) == 5 and len(set(line)) == 5 and list(line) == sorted(line) and line[-1] == "█"
    assert sparkline([5.0, 4.0, 3.0, 2.0, 1.0], width=20)[-1] == "▁"
    spike = [0.0] * 999 + [1.0]
    line = sparkline(spike, width=20)
    assert len(line) == 20 and line[-1] == "█" and set(line[:-1]) == {"▁"}
    assert sparkline([1.0] * 999 + [0.0], width=30)[-1] == "▁"
    assert sparkline([3.0, 1.0, 2.0], width=1) == "█"
