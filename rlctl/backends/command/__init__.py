"""command: a trainer rlctl does not know (seed 003's `torchrun ... rl_runner.py --cfg ...`), described by its recipe.

The `[backend.command]` table gives the command, where its metrics are (regexes over its output with named groups, or
a JSONL file it writes) and how its keys map to rlctl's names, the checkpoint folders it writes (a pattern with the
step, a marker file written last) and how it resumes (arguments appended, or another command). See
docs/backends/command.md.

rlctl runs the command through a small runner rendered into the run directory (`command_runner.py`, standard
library only): it resolves the resume request against the checkpoints on disk when the attempt starts (so a restart
resumes from the newest complete one), turns the trainer's metrics into `{"rlctl_command": {...}}` lines of the run's
backend_metrics.jsonl (which `parse` reads), and leaves a descriptor of the checkpoint layout in the checkpoint
directory (which `checkpoints` reads). The adapter itself stays stateless.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import sys
from itertools import repeat
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from rlctl.backends.base import Backend, Finding, LaunchPlan, LazyTable
from rlctl.backends.command import runner as _runner
from rlctl.backends.command.values import _argv, _fields, check_unified
from rlctl.core.components import Component
from rlctl.errors import RlctlError

if TYPE_CHECKING:
    from rlctl.backends.command.options import CommandOptions
    from rlctl.backends.layout import Checkpoint
    from rlctl.recipe.schema import Recipe

CONFIG_FILE = "command.json"
RUNNER_FILE = "command_runner.py"
RUN_DIR = _runner.RUN_DIR_TOKEN  # the run directory, substituted by the runner when the attempt starts
NAME = "command"


_BULK = re.compile(r'^\{"' + _runner.RECORD_KEY + r'": \{[^\n\r\x1b{}\[\]]*\}\}$', re.M)  # flat, plain lines


class _AttachedParser:
    """Reads an attached trainer's own output: JSON lines (nested objects flattened with '/') and the log patterns,
    keys named by the metrics map, the rest kept as command/<key>; the runner's own records as well."""

    metric_needles: tuple[str, ...] = ()  # with log patterns, any line may hold metrics

    def __init__(self, backend: CommandBackend, options: dict[str, Any]):
        self.backend = backend
        self.tr = _runner.Translator({"patterns": options.get("log_pattern") or [],
                                      "map": options.get("metrics_map") or {},
                                      "step_key": options.get("step_key") or "step"})
        if not self.tr.patterns:  # JSON lines only (the runner's among them): a line without `{` holds none
            self.metric_needles = ("{",)

    def __call__(self, line: str | dict[str, Any]) -> dict[str, Any] | None:
        from rlctl.metrics import clean_value

        if isinstance(line, dict):  # a TensorBoard / W&B / trainer_state row
            row = dict(line)
            if "_step" in row and self.tr.step_key not in row:
                row[self.tr.step_key] = row.pop("_step")
            rec = _runner.to_record(_runner.flat(row), self.tr.map, self.tr.step_key)
        elif line.lstrip().startswith(self.backend.metric_needles[0]):
            return self.backend.parse(line)
        else:
            rec = self.tr.json_line(line) or self.tr.line(line)
        if rec is None:
            return None
        return {k: (v if k == "step" else clean_value(v)) for k, v in rec.items()}

    def metric_bulk(self, text: str) -> dict[int, dict[str, Any]]:
        """The runner's own record lines of a chunk, read in bulk: the adapter's bulk reader reads only lines that
        begin with the record's head, which this parser hands to the adapter's parse too."""
        return self.backend.metric_bulk(text)


def _options() -> type[CommandOptions]:
    from rlctl.backends.command.options import CommandOptions

    return CommandOptions


class CommandBackend(Backend):
    name = NAME
    table_model = LazyTable("rlctl.backends.command.options:CommandOptions")  # pydantic: only for recipes
    # The runtime is the user's command, which rlctl cannot name; the core expects a first package, so rlctl itself
    # (whose adapter and runner run the command) stands in.
    packages = ("rlctl",)
    runs_on_cpu = True  # the command decides; rlctl does not ask for GPUs it knows nothing about
    metric_needles = ('{"' + _runner.RECORD_KEY + '"',)

    def target_version(self, recipe: Recipe) -> str | None:
        return recipe.backend.version  # the trainer's own version, if the recipe says

    def uses_vllm(self, recipe: Recipe) -> bool:
        return False  # unknown: no vLLM rule applies to a command rlctl cannot see into

    def gpu_roles(self, recipe: Recipe) -> list[set[str]] | None:
        """The command's GPUs are the trainer's, unless the recipe says which hold its inference engine
        (resources.inference_gpus, e.g. seed 004's inference GPU 0 and trainer GPU 1)."""
        res = recipe.resources
        if res.inference_gpus is None:
            return super().gpu_roles(recipe)
        inf = set(res.inference_gpus)
        trn = set(res.trainer_gpus) if res.trainer_gpus is not None else set(range(res.gpus_per_node)) - inf
        return [{role for role, ids in (("trainer", trn), ("vllm", inf)) if i in ids}
                for i in range(res.gpus_per_node)]

    def log_components(self, recipe: Recipe) -> dict[str, Component]:
        """The command's output (stdout.log) is the trainer's; `logs` names the others' files, `processes` their
        processes."""
        opts = recipe.backend.table(self.name)
        out = super().log_components(recipe)
        if not isinstance(opts, _options()):
            return out
        cwd = opts.cwd or "."
        for name, path in opts.logs.items():
            where = path if Path(path).is_absolute() else str(Path(cwd) / path)
            out[name] = Component(name, files=(where,), process=opts.processes.get(name), where=where)
        for name, rx in opts.processes.items():
            if name not in out:
                out[name] = Component(name, process=rx, where="its process is watched, but no log file is named "
                                      "for it: add it to backend.command.logs")
            elif name == "trainer":
                out[name] = Component(name, main_log=True, process=rx, where=out[name].where)
        return out

    def multi_node(self, recipe: Recipe) -> str | None:
        opts = recipe.backend.table(NAME)
        if getattr(opts, "multi_node", None):
            return opts.multi_node
        command = getattr(opts, "command", None)
        first = _argv(command)[:1] if command else []
        return "torchrun" if first and Path(first[0]).name == "torchrun" else None

    def options(self, recipe: Recipe) -> CommandOptions:
        table = recipe.backend.table(self.name)
        if not isinstance(table, _options()):
            raise RlctlError("the command backend needs a [backend.command] table with `command = [...]`.",
                             hint='[backend.command]\ncommand = ["torchrun", "--nproc_per_node=2", "train.py"]')
        return table

    # ---- render ----------------------------------------------------------------------------------------------------
    def placeholders(self, recipe: Recipe, dataset_size: int | None) -> dict[str, Any]:
        r = recipe
        opts = recipe.backend.table(self.name)
        return {
            "model": r.model.path, "train_data": r.data.train, "eval_data": r.data.eval,
            "steps": self.total_steps(r, dataset_size), "lr": r.optim.lr, "seed": r.train.seed,
            "group_size": r.rollout.group_size, "prompts_per_step": r.rollout.prompts_per_step,
            "max_tokens": r.rollout.max_tokens, "temperature": r.rollout.temperature,
            "train_batch_size": r.train.train_batch_size, "micro_batch_size": r.train.micro_batch_size,
            "kl_coef": r.algorithm.kl_coef, "checkpoint_dir": self._checkpoint_dir(r, opts),
            # counts a smoke run or a recipe leaves unset are 0 ("never" / "all" to most trainers), not an error
            "checkpoint_every": r.checkpoint.every or 0, "keep_last": r.checkpoint.keep_last or 0, "name": r.name,
            "run_dir": RUN_DIR,
            "metrics_file": getattr(opts, "metrics_file", None),
        }

    # placeholder -> the recipe key it carries to the command (what the command can honour at all)
    PLACEHOLDER_KEYS: ClassVar[dict[str, str]] = {
        "lr": "optim.lr", "seed": "train.seed", "group_size": "rollout.group_size",
        "prompts_per_step": "rollout.prompts_per_step", "max_tokens": "rollout.max_tokens",
        "temperature": "rollout.temperature", "train_batch_size": "train.train_batch_size",
        "micro_batch_size": "train.micro_batch_size", "kl_coef": "algorithm.kl_coef", "steps": "train.steps",
        "checkpoint_every": "checkpoint.every", "keep_last": "checkpoint.keep_last"}

    def honours(self, recipe: Recipe, key: str) -> bool | None:
        """A recipe key reaches the command only through its placeholder: `optim.lr` is honoured when the command
        has `{lr}`; keys without a placeholder (algorithm.eps_clip, optim.max_grad_norm, ...) never are."""
        table = recipe.backend.table(self.name)
        if not isinstance(table, _options()):
            return None
        templates = [*_argv(table.command), *(_argv(table.resume_command) if table.resume_command else [])]
        used = {self.PLACEHOLDER_KEYS.get(f) for t in templates for f in _fields(t)}
        return key in used

    @staticmethod
    def _checkpoint_dir(recipe: Recipe, opts: Any) -> str:
        """checkpoint.dir as the command sees it: relative paths are inside the run directory, so a command that runs
        elsewhere (`cwd`) gets the run directory spelled out when the attempt starts."""
        d = recipe.checkpoint.dir
        if Path(d).is_absolute() or not getattr(opts, "cwd", None):
            return d
        return f"{RUN_DIR}/{d}"

    def _fill(self, template: str, values: dict[str, Any], where: str) -> str:
        for f in _fields(template):
            if f not in values:
                raise RlctlError(f"backend.command.{where}: unknown placeholder {{{f}}} in {template!r}.",
                                 hint="known: " + ", ".join(f"{{{k}}}" for k in values)
                                 + "; write {{ and }} for literal braces")
            if values[f] is None:
                raise RlctlError(f"backend.command.{where}: {{{f}}} is used in {template!r} but the recipe does "
                                 "not set it.", hint=f"set the recipe key behind {{{f}}}, or drop it from the command")
        return template.format(**{k: "" if v is None else v for k, v in values.items()})

    def config(self, recipe: Recipe, dataset_size: int | None) -> dict[str, Any]:
        opts = self.options(recipe)
        values = self.placeholders(recipe, dataset_size)
        if opts.metrics_file:
            values["metrics_file"] = self._fill(opts.metrics_file, {**values, "metrics_file": None}, "metrics_file")
        if opts.shell and isinstance(opts.command, str):
            # one script, its pipes and quoting intact; the values are words of it, so they are quoted
            argv = [self._fill(opts.command, {k: v if v is None else shlex.quote(str(v)) for k, v in values.items()},
                               "command")]
        else:  # an argv list, or a string split like a shell would
            argv = [self._fill(a, values, "command") for a in _argv(opts.command)]
        for key, value in opts.extra.items():  # the escape hatch: --key value
            if value is False or value is None:
                continue
            argv += [f"--{key}"] if value is True else [f"--{key}", str(value)]
        patterns = [opts.log_pattern] if isinstance(opts.log_pattern, str) else list(opts.log_pattern or [])
        resume = recipe.checkpoint.resume
        return {
            "argv": argv,
            "shell": opts.shell,
            "cwd": opts.cwd or ".",
            "resume_argv": self._resume_argv(opts),
            "metrics": {"patterns": patterns, "file": values["metrics_file"], "step_key": opts.step_key,
                        "map": dict(opts.metrics_map)},
            "checkpoint": {"dir": recipe.checkpoint.dir, "pattern": opts.checkpoint_pattern,
                           "marker": opts.checkpoint_marker,
                           "resume_args": _argv(opts.resume_args) if opts.resume_args else [],
                           "resume": resume if opts.checkpoint_pattern else "off",
                           # the step a final checkpoint saved without one (`step_final/`) stands for, until the
                           # runner records the last step the trainer logged
                           "total_steps": self.total_steps(recipe, dataset_size)},
        }

    @staticmethod
    def _resume_argv(opts: CommandOptions) -> list[str] | None:
        if not opts.resume_command:
            return None
        rc = opts.resume_command
        return [rc] if opts.shell and isinstance(rc, str) else _argv(rc)

    def render(self, recipe: Recipe, dataset_size: int | None = None) -> LaunchPlan:
        cfg = self.config(recipe, dataset_size)
        notes = self._resume_notes(recipe, cfg)
        return LaunchPlan(
            backend=self.name, version=self.target_version(recipe),
            argv=["python3", RUNNER_FILE, CONFIG_FILE],
            env={"PYTHONUNBUFFERED": "1", **recipe.env},
            files={CONFIG_FILE: json.dumps(cfg, indent=2) + "\n",
                   RUNNER_FILE: Path(_runner.__file__).read_text()},
            total_steps=self.total_steps(recipe, dataset_size), notes=notes,
        )

    def _resume_notes(self, recipe: Recipe, cfg: dict[str, Any]) -> list[str]:
        """What resuming will do, as far as it can be told before the run directory exists."""
        ck = cfg["checkpoint"]
        want = ck["resume"]
        shown = " ".join(cfg["argv"])
        if want == "off":
            if recipe.checkpoint.resume != "off":
                return [f"checkpoint.resume = {recipe.checkpoint.resume!r} ignored: backend.command has no "
                        "checkpoint_pattern"]
            return [f"command: {shown}"]
        if not Path(ck["dir"]).is_absolute():
            return [f"command: {shown}", f"resumes from {want} checkpoint in {ck['dir']} (looked up in the run "
                    "directory when the run starts)"]
        try:
            found = _runner.pick_resume(cfg)
        except LookupError as e:  # preflight's checkpoint.resume check fails on it, with the key's line and the steps
            return [f"command: {shown}", f"checkpoint.resume = {want}: {e}: the run would fail at start"]
        if found is None:
            return [f"command: {shown}", f"no complete checkpoint in {ck['dir']} yet: starts fresh"]
        full = _runner.command_argv(cfg, found)
        return [f"command: {' '.join(full)}", f"resumes from checkpoint step {found[0]} ({found[1]})"]

    def prepare_launch(self, plan: LaunchPlan, run_dir: Path) -> LaunchPlan:
        """The runner needs nothing of rlctl: run it with the Python rlctl runs in (python3 may be another)."""
        del run_dir  # Unused
        if plan.argv and plan.argv[0] == "python3":
            plan.argv = [sys.executable, *plan.argv[1:]]
        return plan

    def prune_during_run(self, recipe: Recipe) -> bool:
        """rlctl cannot know whether the command honours {keep_last}: it prunes to keep_last itself (the newest
        complete checkpoint and anything newer are never touched)."""
        table = recipe.backend.table(self.name)
        return bool(getattr(table, "checkpoint_pattern", None))

    # ---- checks ----------------------------------------------------------------------------------------------------
    def validate(self, plan: LaunchPlan, installed_version: str | None) -> list[Finding]:
        """The command can be found, and rlctl will see its metrics and checkpoints."""
        del installed_version  # Unused: rlctl knows no releases of a command
        try:
            cfg = json.loads(plan.files[CONFIG_FILE])
        except (KeyError, ValueError):
            return [Finding("error", "command", "the command backend's plan has no command.json")]
        out = []
        prog = cfg["argv"][0] if cfg["argv"] and not cfg["shell"] else None
        if prog and "/" not in prog and shutil.which(prog) is None:
            out.append(Finding("error", "command", f"`{prog}` is not on PATH",
                               "install it, or give its full path in backend.command.command"))
        elif prog and "/" in prog and Path(prog).is_absolute() and not Path(prog).exists():
            out.append(Finding("error", "command", f"{prog} does not exist", "fix backend.command.command"))
        if Path(cfg["cwd"]).is_absolute() and not Path(cfg["cwd"]).is_dir():
            out.append(Finding("warn", "cwd", f"backend.command.cwd {cfg['cwd']} is not a directory on this machine "
                               "(the command runs there)", "fix the path, or launch where it exists"))
        m = cfg["metrics"]
        if not m["patterns"] and not m["file"]:
            out.append(Finding("warn", "log_pattern", "rlctl will see no metrics of this command (no log_pattern, "
                               "no metrics_file): status shows no steps, doctor has nothing to read",
                               "set backend.command.log_pattern or metrics_file"))
        ck = cfg["checkpoint"]
        if not ck["pattern"]:
            out.append(Finding("warn", "checkpoint_pattern", "rlctl cannot see this command's checkpoints: ckpt list, "
                               "prune, resume and restarts need backend.command.checkpoint_pattern",
                               'e.g. checkpoint_pattern = "step_{step}"'))
        elif not any(Path(ck["dir"]).name in a for a in [*cfg["argv"], *(cfg["resume_argv"] or [])]):
            out.append(Finding("warn", "command", f"the command never mentions checkpoint.dir ({ck['dir']}): rlctl "
                               "looks for checkpoints there only", "pass {checkpoint_dir} to the command"))
        elif not ck["marker"]:
            out.append(Finding("warn", "checkpoint_marker", "no checkpoint_marker: a half-written checkpoint counts as "
                               "complete (resume and pruning may pick it)",
                               "set backend.command.checkpoint_marker to a file the trainer writes last"))
        elif not ck["resume_args"] and not cfg["resume_argv"]:
            out.append(Finding("warn", "resume_args", "no resume_args: restarts and --resume start from scratch",
                               'e.g. resume_args = ["--resume", "{path}"]'))
        return out

    # ---- metrics ---------------------------------------------------------------------------------------------------
    def parse(self, line: str | dict[str, Any]) -> dict[str, Any] | None:
        """A record the runner wrote (`{"rlctl_command": {...}}`), in rlctl's names already."""
        from rlctl.metrics import clean_value
        from rlctl.metrics.parsers import Malformed

        if isinstance(line, dict):
            inner = line.get(_runner.RECORD_KEY)
        else:
            s = line.strip()
            if not s.startswith(self.metric_needles[0]):
                return None
            try:
                inner = json.loads(s)[_runner.RECORD_KEY]
            except (ValueError, KeyError, TypeError) as e:
                raise Malformed(str(e)) from None
        if not isinstance(inner, dict):
            return None
        rec = {k: clean_value(v) for k, v in inner.items() if k != "step"}
        if "step" in inner:
            rec["step"] = inner["step"] if type(inner["step"]) is int else None
        return rec

    reads_any_log = True  # attach: any trainer's JSON lines / patterns, named by a metrics map

    def parser_options(self, recipe: Recipe | None, metrics_map: dict[str, str] | None) -> dict[str, Any] | None:
        """The recipe's [backend.command] metrics declarations (metrics_map, step_key, log_pattern), the explicit
        map on top: `attach --backend command --recipe R.toml --metrics-map loss=policy_loss`."""
        out: dict[str, Any] = {"metrics_map": {}, "step_key": "step", "log_pattern": []}
        table = recipe.backend.table(self.name) if recipe is not None else None
        if table is not None and isinstance(table, _options()):
            out["metrics_map"] = dict(table.metrics_map)
            out["step_key"] = table.step_key
            pats = table.log_pattern
            out["log_pattern"] = [pats] if isinstance(pats, str) else list(pats or [])
        if metrics_map:
            try:
                out["metrics_map"].update(check_unified(metrics_map, "--metrics-map"))
            except ValueError as e:
                raise RlctlError(str(e), hint="write --metrics-map trainer_key=unified_name,... "
                                 "(see docs/metrics.md for the names)") from None
        return out

    def options_parser(self, options: dict[str, Any] | None) -> Any:
        return _AttachedParser(self, options or {})


    def metric_bulk(self, text: str) -> dict[int, dict[str, Any]]:
        """The runner's plain record lines of a chunk, read by one JSON parse in C (the stream's fast path), by the
        offset where each line starts: exactly what `parse` makes of each; the other lines are left to `parse`."""
        from rlctl.metrics.parsers import json_objects, lines_with, plain_lines, plain_numbers, plain_rows

        head = '{"' + _runner.RECORD_KEY + '": {'
        starts, lines = plain_lines(*lines_with(text, head), head, "}}", ascii_only=False)
        rows = json_objects("[" + ",".join(lines) + "]") if lines else None
        if rows is not None and len(rows) == len(lines):
            # each line one value (their count says so); a number or a string in C, as the standard library reads it
            inners = list(map(dict.get, rows, repeat(_runner.RECORD_KEY))) if set(map(type, rows)) == {dict} else []
            if (inners and all(plain_rows(inners))
                    and set(map(type, map(dict.get, inners, repeat("step"), repeat(0)))) == {int}):
                return dict(zip(starts, inners, strict=True))  # numbers clean_value keeps; int steps (or none)
        out = {}
        for m in _BULK.finditer(text):  # a chunk with other lines: each on its own
            try:
                row = json.loads(m.group(0))
            except ValueError:
                continue
            inner = row.get(_runner.RECORD_KEY) if type(row) is dict else None
            if plain_numbers(inner) and type(inner.get("step", 0)) is int:
                out[m.start()] = inner
        return out

    # ---- checkpoints -----------------------------------------------------------------------------------------------
    def describe_checkpoints(self, recipe: Recipe, root: Path) -> None:
        """The runner's layout descriptor under root (the recipe's checkpoint_pattern and marker), as a launch writes
        it there; one already there is kept."""
        table = recipe.backend.table(self.name)
        if isinstance(table, _options()) and table.checkpoint_pattern and not (root / _runner.DESCRIPTOR).exists():
            _runner.write_descriptor({"checkpoint": {"dir": str(root), "pattern": table.checkpoint_pattern,
                                                     "marker": table.checkpoint_marker}})

    def checkpoints(self, root: Path) -> list[Checkpoint]:
        """The checkpoint folders under root, as the runner described them in root/.rlctl-checkpoints.json."""
        from rlctl.backends.layout import Checkpoint

        try:
            desc = json.loads((root / _runner.DESCRIPTOR).read_text())
            pattern, marker = desc["pattern"], desc.get("marker")
        except (OSError, ValueError, KeyError, TypeError):
            return []
        try:
            found = _runner.scan(str(root), pattern, marker, _runner.descriptor_final_step(str(root)))
        except (ValueError, re.error):
            return []
        return [Checkpoint(step, Path(path), done) for step, path, done in found]
