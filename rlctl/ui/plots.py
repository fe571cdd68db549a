"""Pictures: the LR curve, metric curves of runs overlaid. matplotlib is imported only here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlctl.errors import RlctlError


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RlctlError("plotting needs matplotlib.", hint='pip install "rlctl[plot]"') from None
    return plt


def plot_lr(lrs: list[float], recipe: Any, out: Path) -> None:
    if not lrs:
        raise RlctlError("no LR curve: the number of steps is unknown (see schedule.steps).")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(range(1, len(lrs) + 1), lrs)
    k = recipe.preflight.lr_check_step
    ax.axvline(k, color="grey", linestyle=":", label=f"step {k}")
    ax.axhline(recipe.optim.lr * recipe.preflight.lr_check_min_fraction, color="red", linestyle=":",
               label=f"{recipe.preflight.lr_check_min_fraction:.0%} of target")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("learning rate")
    ax.set_title(f"{recipe.name}: {recipe.backend.name} {recipe.optim.schedule}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def plot_runs(data: dict[str, dict[str, list[tuple[int, float]]]], keys: list[str], out: Path) -> None:
    """One panel per metric, every run overlaid (e.g. a multi-signal run against its naive baseline)."""
    if not any(pts for by_key in data.values() for pts in by_key.values()):
        raise RlctlError(f"none of the runs has {', '.join(keys)}; see rlctl status RUN for the keys it logs.")
    plt = _pyplot()
    fig, axes = plt.subplots(len(keys), 1, figsize=(8, 3 * len(keys)), squeeze=False)
    for ax, key in zip(axes[:, 0], keys, strict=True):
        for name, by_key in data.items():
            pts = by_key.get(key) or []
            if pts:
                ax.plot([s for s, _ in pts], [v for _, v in pts], label=name)
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
