"""Tables for the terminal (rich), plain when output is not a terminal."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.table import Table

VERDICT_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


def console() -> Console:
    return Console(file=sys.stdout, width=None if sys.stdout.isatty() else 200, soft_wrap=not sys.stdout.isatty())


def preflight_table(results: list[Any], title: str) -> None:
    counts = {v: sum(1 for r in results if r.verdict == v) for v in ("fail", "warn", "ok", "skip")}
    summary = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
    if not sys.stdout.isatty():  # logs and CI: one line per check, no box drawing
        lines = [title]
        width = max((len(r.check) for r in results), default=10)
        for r in results:
            lines.append(f"{r.verdict.upper():<5} {r.check:<{width}}  {r.figure}")
            if r.fix:
                lines.append(f"{'':<5} {'':<{width}}  fix: {r.fix}")
            for note in r.data.get("notes", []) if isinstance(r.data, dict) else []:
                lines.append(f"{'':<5} {'':<{width}}  note: {note}")
        lines.append(summary)
        sys.stdout.write("\n".join(lines) + "\n")
        return
    t = Table(title=title, show_lines=False, expand=False)
    t.add_column("check", no_wrap=True)
    t.add_column("verdict", no_wrap=True)
    t.add_column("figure")
    t.add_column("fix")
    for r in results:
        notes = r.data.get("notes", []) if isinstance(r.data, dict) else []
        figure = "\n".join([r.figure, *(f"[dim]note: {n}[/]" for n in notes)])
        t.add_row(r.check, f"[{VERDICT_STYLE.get(r.verdict, '')}]{r.verdict}[/]", figure, r.fix or "")
    c = console()
    c.print(t)
    c.print(summary)
