"""The live progress line of an attached launch: step/total, reward, elapsed, ETA, from the metrics stream."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import IO


def fmt_duration(seconds: float | None) -> str:
    if seconds is None or seconds < 0:  # no estimate (a step past the run's total has none either)
        return "-"
    s = int(seconds)
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def fmt_num(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "-" if v is None else str(v)


QUIET = re.compile(r"attempt 1 started \(launch|attempt \d+ started \(|attempt \d+ ended: finished|run finished")


class Progress:
    def __init__(self, out: IO[str], total: int | None, interval: float = 5.0):
        self.out = out
        self.total = total
        self.start = time.time()
        self.interval = interval
        self.last_print = 0.0
        self.last_step: int | None = None
        self.last_text: str | None = None
        self.said = 0  # bytes of supervisor.log already shown
        self.tty = hasattr(out, "isatty") and out.isatty()

    def news(self, run_dir: Path) -> list[str]:
        """The supervisor's new lines (an attempt ended, a restart, a stall): what a watcher of the console must not
        miss while the step line goes on."""
        try:
            with (run_dir / "supervisor.log").open("rb") as fh:
                fh.seek(self.said)
                data = fh.read()
        except OSError:
            return []
        end = data.rfind(b"\n") + 1
        self.said += end
        out = []
        for line in data[:end].decode(errors="replace").splitlines():
            text = line.split(" rlctl supervisor: ", 1)[-1]
            if not QUIET.match(text):  # a run going as launched says nothing here; the end has its own line
                out.append(f"rlctl: {text}")
        return out

    def line(self, run_dir: Path) -> str | None:
        from rlctl.metrics.stream import METRICS, by_step, tail_records

        merged = by_step(tail_records(run_dir / METRICS, max_bytes=256 * 1024))
        if not merged:
            return None
        step = max(merged)
        rec = merged[step]
        elapsed = time.time() - self.start
        eta = elapsed / step * (self.total - step) if self.total and step else None
        total = f"/{self.total}" if self.total else ""
        self.last_step = step
        return (f"step {step}{total}  reward {fmt_num(rec.get('reward/mean'))}  "
                f"elapsed {fmt_duration(elapsed)}  eta {fmt_duration(eta)}")

    def tick(self, run_dir: Path) -> None:
        now = time.time()
        news = self.news(run_dir)
        if news:
            self.out.write(("\r\x1b[2K" if self.tty else "") + "\n".join(news) + "\n")
            self.out.flush()
        if not self.tty and now - self.last_print < self.interval:
            return
        text = self.line(run_dir)
        if text is None:
            return
        self.last_print = now
        self.last_text = text
        if self.tty:
            self.out.write("\r\x1b[2K" + text)
        else:
            self.out.write(text + "\n")
        self.out.flush()

    def done(self, run_dir: Path) -> None:
        from rlctl.runs.state import read_state

        text = self.line(run_dir)
        state = read_state(run_dir)
        if self.tty:
            self.out.write("\r\x1b[2K")  # the live line gives way to the final one
        for line in self.news(run_dir):
            self.out.write(line + "\n")
        if text and (self.tty or text.split("  elapsed")[0] != (self.last_text or "").split("  elapsed")[0]):
            self.out.write(text + "\n")  # not the same step line again (it was printed twice: new-user trial)
        by = state.get("stopped_by") if isinstance(state.get("stopped_by"), dict) else None
        if by:  # the recipe's own rule ended it: say which, and what is kept
            self.out.write(f"stopped by stop_when {by.get('rule')}: {by.get('message')}\n")
            best = state.get("best_checkpoint") if isinstance(state.get("best_checkpoint"), dict) else None
            if best:
                self.out.write(f"best checkpoint: step {best.get('step')} ({best.get('key')} = {best.get('value')})"
                               "\n")
        self.out.write(f"{state.get('status', '?')} (exit code {state.get('exit_code')}): {run_dir}\n")
        self.out.flush()
