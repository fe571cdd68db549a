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


FORMATS = ("png", "pdf", "svg", "svgz", "jpg", "jpeg", "eps", "ps", "webp", "tif", "tiff", "gif")


def check_out(out: Path, option: str = "--plot") -> None:
    """Refuse, before any work, a picture path that cannot be written: unknown extension, missing or non-directory
    parent, a directory in its place."""
    ext = out.suffix.lower().lstrip(".")
    if ext not in FORMATS:
        what = repr(out.suffix) if out.suffix else "(no extension)"
        raise RlctlError(f"{option} {out}: unknown picture format {what}.",
                         hint=f"end the name with one of: .{', .'.join(FORMATS[:6])}")
    if out.is_dir():
        raise RlctlError(f"{option} {out}: is a directory.", hint=f"name a file, e.g. {out / ('plot.' + 'png')}")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise RlctlError(f"{option} {out}: the directory {parent} does not exist (or is not a directory).",
                         hint=f"mkdir -p {parent}")


def _save(fig: Any, out: Path) -> None:
    try:
        fig.savefig(out, dpi=100)
    except OSError as e:
        raise RlctlError(f"--plot {out}: cannot be written ({e.strerror or e}).",
                         hint="check the directory exists and is writable.") from None
    except ValueError as e:  # matplotlib: unsupported format
        raise RlctlError(f"--plot {out}: {e}.") from None


def plot_lr(lrs: list[float], recipe: Any, out: Path) -> None:
    check_out(out)
    if not lrs:
        raise RlctlError("no LR curve: the number of steps is unknown or above the limit (see schedule.steps).")
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
    try:
        _save(fig, out)
    finally:
        plt.close(fig)


def plot_runs(data: dict[str, dict[str, list[tuple[int, float]]]], keys: list[str], out: Path) -> None:
    """One panel per metric, every run overlaid (e.g. a multi-signal run against its naive baseline)."""
    check_out(out)
    if not any(pts for by_key in data.values() for pts in by_key.values()):
        raise RlctlError(f"none of the runs has {', '.join(keys)}; see rlctl status RUN for the keys it logs.")
    plt = _pyplot()
    fig, axes = plt.subplots(len(keys), 1, figsize=(8, 3 * len(keys)), squeeze=False)
    for ax, key in zip(axes[:, 0], keys, strict=True):
        for name, by_key in data.items():
            pts = by_key.get(key) or []
            if pts:
                line = ax.plot([s for s, _ in pts], [v for _, v in pts], label=name,
                               marker="o" if key.startswith("eval/") else None)[0]
                if key.startswith("eval/") and pts[0][0] == 0:  # each eval against its step-0 baseline
                    ax.axhline(pts[0][1], linestyle="--", linewidth=0.8, color=line.get_color(),
                               label=f"{name} baseline (step 0)")
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.legend(fontsize="small")
    fig.tight_layout()
    try:
        _save(fig, out)
    finally:
        plt.close(fig)
