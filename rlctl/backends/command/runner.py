"""The command backend's runner: starts the trainer's own command and turns what it logs into rlctl records.

`python3 command_runner.py command.json` (rendered into the run directory, standard library only, so any Python 3
where the trainer runs will do). It

- resolves the resume request of the recipe (`latest` or a step) against the checkpoints on disk *now* and appends
  the recipe's resume arguments for the newest complete one (so every restart picks up the latest checkpoint);
- writes `.rlctl-checkpoints.json` into the checkpoint directory: the pattern and marker the adapter reads back when
  `rlctl ckpt list`, `prune` or a restart look at that directory;
- starts the command in the same process group with the same stdout (a file: the trainer never waits on rlctl), and
  while it runs follows that output (log patterns) and the trainer's JSONL metrics file, appending one
  `{"rlctl_command": {...}}` line per record to `$RLCTL_METRICS_FILE` (the run's backend_metrics.jsonl), which the
  adapter's `parse` reads;
- ignores SIGTERM/SIGINT itself (the group's signal reaches the trainer), reads what is left once the trainer ended,
  and exits as the trainer did.

On several nodes an executor starts one runner per node with `RLCTL_NODE_RANK` set (the SLURM executor: `srun`,
each node its own torchrun). Only node rank 0's runner reports (records, the checkpoint descriptor): the others run
the command and exit as it does, so each record is written once. Their output is gathered into the run's log rather
than each runner's own stdout (a pipe), so node 0 follows the log file of the run.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

DESCRIPTOR = ".rlctl-checkpoints.json"
RECORD_KEY = "rlctl_command"
OUT_DEFAULT = "backend_metrics.jsonl"
RUN_DIR_TOKEN = "${RLCTL_RUN_DIR}"  # in the rendered command: the run directory (this process's working directory)
POLL = 0.25
CHUNK = 4 * 1024 * 1024


# ---- checkpoints ----------------------------------------------------------------------------------------------------
def checkpoint_regex(pattern: str) -> re.Pattern[str]:
    """`step_{step}` / `ckpt-*-{step}` (a glob over one folder name, `{step}` the step number) or `re:<regex>` (the
    step is the group named `step`, else the first group)."""
    if pattern.startswith("re:"):
        rx = re.compile(pattern[3:])
        if rx.groups < 1:
            raise ValueError(f"checkpoint pattern {pattern!r} has no group for the step")
        return rx
    if "{step}" not in pattern:
        raise ValueError(f"checkpoint pattern {pattern!r} has no {{step}}")
    if "/" in pattern:
        raise ValueError(f"checkpoint pattern {pattern!r} must name one folder inside checkpoint.dir (no '/')")
    head, _, tail = pattern.partition("{step}")
    return re.compile(f"^{_glob(head)}(?P<step>\\d+){_glob(tail)}$")


def _glob(part: str) -> str:
    return re.escape(part).replace(r"\*", ".*").replace(r"\?", ".")


FINAL_WORDS = ("final", "last")  # `step_final/`: the checkpoint a trainer saves at the end, without its step


def final_regex(pattern: str) -> re.Pattern[str] | None:
    """The folder name of a final checkpoint saved without a step number (`step_{step}` -> `step_final`), or None
    for a `re:` pattern (its own regex says what a checkpoint is)."""
    if pattern.startswith("re:") or "{step}" not in pattern:
        return None
    head, _, tail = pattern.partition("{step}")
    return re.compile(f"^{_glob(head)}(?:{'|'.join(FINAL_WORDS)}){_glob(tail)}$")


def step_of(rx: re.Pattern[str], name: str) -> int | None:
    m = rx.match(name)
    if not m:
        return None
    try:
        return int(m.group("step") if "step" in rx.groupindex else m.group(1))
    except (TypeError, ValueError):
        return None


def scan(root: str, pattern: str, marker: str | None, final_step: int | None = None) -> list[tuple[int, str, bool]]:
    """(step, path, complete) of the checkpoint folders under root, oldest first. Symlinks are never checkpoints;
    a folder is complete once its marker file exists (no marker configured: every folder counts as complete).

    A final checkpoint saved without a step (`step_final/`) is the last step: `final_step` (the last step the run
    logged, else its total) when known, else the newest numbered step; it sorts after every numbered one."""
    rx = checkpoint_regex(pattern)
    frx = final_regex(pattern)
    out, finals = [], []
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    for name in names:
        path = os.path.join(root, name)
        if os.path.islink(path) or not os.path.isdir(path):
            continue
        step = step_of(rx, name)
        if step is None:
            if frx is not None and frx.match(name):
                finals.append(path)
            continue
        done = os.path.isfile(os.path.join(path, marker.replace("{step}", str(step)))) if marker else True
        out.append((step, path, done))
    out.sort(key=lambda t: t[0])
    for path in finals:
        step = final_step if final_step is not None else (out[-1][0] if out else 0)
        step = max([step, *(s for s, _, _ in out)])
        done = os.path.isfile(os.path.join(path, marker.replace("{step}", str(step)))) if marker else True
        out.append((step, path, done))
    return out


def descriptor_final_step(root: str) -> int | None:
    """The step a final checkpoint under root stands for, as the runner recorded it (the last step logged when the
    trainer ended, else the run's total steps)."""
    try:
        with open(os.path.join(root, DESCRIPTOR)) as fh:
            desc = json.load(fh)
    except (OSError, ValueError):
        return None
    for key in ("final_step", "total_steps"):
        if isinstance(desc, dict) and type(desc.get(key)) is int:
            return desc[key]
    return None


def pick_resume(cfg: dict) -> tuple[int, str] | None:
    """The checkpoint the recipe resumes from: (step, absolute path), or None for a fresh start."""
    ck = cfg.get("checkpoint") or {}
    want = ck.get("resume", "off")
    if want in (None, "off") or not ck.get("pattern"):
        return None
    done = [(s, p) for s, p, ok in scan(ck["dir"], ck["pattern"], ck.get("marker"), descriptor_final_step(ck["dir"]))
            if ok]
    if want == "latest":
        return (done[-1][0], os.path.abspath(done[-1][1])) if done else None
    for s, p in reversed(done):  # a final checkpoint and the numbered one of the same step: the final one
        if s == int(want):
            return s, os.path.abspath(p)
    raise LookupError(f"no complete checkpoint of step {want} in {os.path.abspath(ck['dir'])}")


def fill(template: list[str], values: dict[str, str]) -> list[str]:
    return [a.format(**values) for a in template]


def command_argv(cfg: dict, resume: tuple[int, str] | None, run_dir: str | None = None) -> list[str]:
    """The argv of one attempt: the command, or with the resume template applied. With `shell`, a command given
    as one string stays that string (its quoting and pipes intact) and resume arguments are appended quoted."""
    ck = cfg.get("checkpoint") or {}
    values = {"step": str(resume[0]), "path": resume[1], "dir": os.path.abspath(ck["dir"])} if resume else {}
    if resume is not None and cfg.get("resume_argv"):
        quoted = {k: shlex.quote(v) for k, v in values.items()} if cfg.get("shell") else values
        parts, extra = fill(cfg["resume_argv"], quoted), []
    else:
        parts = list(cfg["argv"])
        extra = fill(ck.get("resume_args") or [], values) if resume is not None else []
    if run_dir is not None:
        parts = [a.replace(RUN_DIR_TOKEN, run_dir) for a in parts]
    if not cfg.get("shell"):
        return parts + extra
    script = parts[0] if len(parts) == 1 else " ".join(shlex.quote(a) for a in parts)
    return ["/bin/sh", "-c", " ".join([script, *(shlex.quote(a) for a in extra)])]


def write_descriptor(cfg: dict, final_step: int | None = None) -> None:
    """The layout of the checkpoint directory for the adapter; `final_step` (the last step logged, once the trainer
    ended) says which step a `step_final/` stands for; a step recorded by an earlier attempt is kept until then."""
    ck = cfg.get("checkpoint") or {}
    if not ck.get("pattern"):
        return
    try:
        os.makedirs(ck["dir"], exist_ok=True)
        path = os.path.join(ck["dir"], DESCRIPTOR)
        tmp = f"{path}.{os.getpid()}.tmp"
        desc = {"backend": "command", "pattern": ck["pattern"], "marker": ck.get("marker"),
                "total_steps": ck.get("total_steps")}
        if final_step is None:
            try:
                with open(path) as fh:
                    final_step = json.load(fh).get("final_step")
            except (OSError, ValueError, AttributeError):
                final_step = None
        if final_step is not None:
            desc["final_step"] = final_step
        with open(tmp, "w") as fh:
            json.dump(desc, fh)
            fh.write("\n")
        os.replace(tmp, path)
    except OSError as e:
        print(f"rlctl-command: could not write {DESCRIPTOR} into {ck['dir']}: {e}", flush=True)


# ---- metrics --------------------------------------------------------------------------------------------------------
def flat(obj: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in obj.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flat(v, key + "/"))
        elif not isinstance(v, (list, tuple)):
            out[key] = v
    return out


def to_record(raw: dict, mapping: dict[str, str], step_key: str, prefix: str = "command") -> dict | None:
    """Trainer keys -> rlctl names (mapped, else `<prefix>/<key>`); the step under `step` (absent: counted)."""
    rec: dict = {}
    for k, v in raw.items():
        if v is None or v == "":
            continue
        if k == step_key:
            try:
                rec["step"] = int(float(v))
            except (TypeError, ValueError):
                rec["step"] = None  # "final", "latest": the step in progress
            continue
        if isinstance(v, str):
            try:
                v = float(v)
            except ValueError:
                v = v.strip()
        rec[mapping.get(k) or f"{prefix}/{k}"] = v
    return rec if len(rec) > ("step" in rec) else None


class Translator:
    def __init__(self, metrics: dict):
        self.patterns = [re.compile(p) for p in metrics.get("patterns") or []]
        self.map = dict(metrics.get("map") or {})
        self.step_key = metrics.get("step_key") or "step"

    def line(self, line: str) -> dict | None:
        for rx in self.patterns:
            m = rx.search(line)
            if m:
                return to_record({k: v for k, v in m.groupdict().items() if v is not None}, self.map, self.step_key)
        return None

    def json_line(self, line: str) -> dict | None:
        line = line.strip()
        if not line.startswith("{"):
            return None
        try:
            obj = json.loads(line)
        except ValueError:
            return None
        return to_record(flat(obj), self.map, self.step_key) if isinstance(obj, dict) else None


class Follower:
    """New complete lines of a file, from where it was when we started (an earlier attempt's lines are done).

    A path with `*`/`?` (a trainer that names its log after the time it started: `training_runs/run_*/logs/x.jsonl`)
    is the newest matching file that appeared, or grew, after we started; read from where it was then."""

    def __init__(self, path: str, handle):
        self.handle, self.carry = handle, b""
        self.pattern = path if any(c in path for c in "*?[") else None
        self.path = None if self.pattern else path
        self.before = self._sizes() if self.pattern else {}
        try:
            self.offset = os.path.getsize(path) if self.path else 0
        except OSError:
            self.offset = 0

    def _sizes(self) -> dict[str, int]:
        import glob

        out = {}
        for p in glob.glob(self.pattern):
            try:
                if os.path.isfile(p):
                    out[p] = os.path.getsize(p)
            except OSError:
                continue
        return out

    def _resolve(self) -> bool:
        if self.path is None:
            fresh = []
            for p, size in self._sizes().items():
                if size > self.before.get(p, -1):
                    try:
                        fresh.append((os.path.getmtime(p), p))
                    except OSError:
                        continue
            if fresh:
                self.path = max(fresh)[1]
                self.offset = self.before.get(self.path, 0)
        return self.path is not None

    def poll(self, final: bool = False) -> None:
        if not self._resolve():
            return
        try:
            size = os.path.getsize(self.path)
        except OSError:
            return
        if size < self.offset:  # truncated or rewritten
            self.offset, self.carry = 0, b""
        if size == self.offset and not (final and self.carry):
            return
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            while True:
                data = fh.read(CHUNK)
                if not data:
                    break
                self.offset += len(data)
                self._lines(self.carry + data)
        if final and self.carry:
            carry, self.carry = self.carry, b""
            self._lines(carry + b"\n")

    def _lines(self, data: bytes) -> None:
        lines = data.split(b"\n")
        self.carry = lines.pop()
        if len(self.carry) > CHUNK:  # a "line" this long is no metrics line
            self.carry = b""
        for raw in lines:
            text = raw.decode("utf-8", errors="replace")
            for seg in text.split("\r"):
                self.handle(seg)


def node_rank() -> int | None:
    """This runner's node among several (`RLCTL_NODE_RANK`, set by an executor that starts one per node), else None."""
    try:
        return int(os.environ["RLCTL_NODE_RANK"])
    except (KeyError, ValueError):
        return None


def own_stdout_path() -> str | None:
    """The file our stdout is (the run's stdout.log), to follow the trainer's output without a pipe. One runner of
    several nodes writes into a pipe that gathers every node's output into the run's log: that log, then."""
    run_dir = os.environ.get("RLCTL_RUN_DIR")
    guess = os.path.join(run_dir, "stdout.log") if run_dir else "stdout.log"
    try:
        import stat

        if not stat.S_ISREG(os.fstat(1).st_mode):
            return guess if node_rank() is not None and os.path.isfile(guess) else None
    except OSError:
        return None
    if os.path.exists("/proc/self/fd/1"):
        return os.path.realpath("/proc/self/fd/1")
    return guess if os.path.isfile(guess) else None


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: command_runner.py command.json", file=sys.stderr)
        return 2
    with open(argv[0]) as fh:
        cfg = json.load(fh)
    base = os.getcwd()
    rank = node_rank()
    reports = not rank  # one runner per node: only the first writes records and the checkpoint descriptor
    said = "rlctl-command" + (f" (node rank {rank})" if rank is not None else "")
    try:
        resume = pick_resume(cfg)
    except LookupError as e:
        print(f"{said}: {e}", flush=True)
        return 2
    total = (cfg.get("checkpoint") or {}).get("total_steps")
    if resume is not None and type(total) is int and 0 < total <= resume[0]:
        # `latest` resolved here to the final checkpoint: the trainer is not started (rlctl's supervisor does the
        # same for a step it knows; a trainer may well train one more step past its end)
        print(f"{said}: nothing left to train: the checkpoint is at step {resume[0]} of {total}", flush=True)
        return 0
    if reports:
        write_descriptor(cfg)
    cmd = command_argv(cfg, resume, base)
    cwd = os.path.join(base, cfg.get("cwd") or ".")
    if resume is not None:
        print(f"{said}: resuming from checkpoint step {resume[0]} ({resume[1]})", flush=True)
    print(f"{said}: " + " ".join(shlex.quote(a) for a in cmd), flush=True)

    metrics = cfg.get("metrics") or {}
    tr = Translator(metrics)
    out_path = os.environ.get("RLCTL_METRICS_FILE") or os.path.join(base, OUT_DEFAULT)
    pending: list[str] = []

    logged = {"last": None, "count": 0}  # the last step the trainer logged (a final checkpoint's step)

    def emit(rec: dict | None) -> None:
        if rec is not None:
            logged["count"] += 1
            if type(rec.get("step")) is int:
                logged["last"] = rec["step"]
            rec.setdefault("time", round(time.time(), 3))  # when it was printed (within POLL), not when ingested
            pending.append(json.dumps({RECORD_KEY: rec}, default=str))

    followers = []
    log = own_stdout_path() if tr.patterns and reports else None
    if log:
        followers.append(Follower(log, lambda s: emit(tr.line(s))))
    if metrics.get("file") and reports:
        mfile = os.path.join(cwd, metrics["file"].replace(RUN_DIR_TOKEN, base))
        followers.append(Follower(mfile, lambda s: emit(tr.json_line(s))))

    def flush() -> None:
        if pending:
            try:
                with open(out_path, "a", encoding="utf-8") as fh:
                    fh.write("\n".join(pending) + "\n")
                pending.clear()
            except OSError:  # a full disk: keep them and retry
                pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)
    try:
        child = subprocess.Popen(cmd, cwd=cwd)
    except OSError as e:
        print(f"{said}: could not start {cmd[0]!r}: {e.strerror or e}", flush=True)
        return 127
    while True:
        code = child.poll()
        for f in followers:
            f.poll(final=code is not None)
        flush()
        if code is not None:
            break
        time.sleep(POLL)
    if logged["count"] and reports:
        write_descriptor(cfg, logged["last"] if logged["last"] is not None else None)
    if code < 0:  # die of the trainer's signal, so the exit record says what killed it (SIGKILL: -9)
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # those two cannot be handled, nor reset (EINVAL)
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
