"""`[backend.command]`: the recipe table of the command adapter (a pydantic model, imported only where recipes are
read: rlctl.backends.base.LazyTable)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from rlctl.backends.command import runner as _runner
from rlctl.backends.command.values import RESUME_FIELDS, _argv, _fields, check_unified
from rlctl.recipe.schema import BackendExtra


class CommandOptions(BackendExtra):
    """`[backend.command]`: how to run, follow, checkpoint and resume a trainer rlctl does not know."""

    command: list[str] | str = Field(
        description="The trainer's command: an argv list, or a string split like a shell would (no shell features "
        "unless `shell = true`). Placeholders from the recipe: {model} {train_data} {eval_data} {steps} {lr} {seed} "
        "{group_size} {prompts_per_step} {max_tokens} {temperature} {train_batch_size} {micro_batch_size} {kl_coef} "
        "{checkpoint_dir} {checkpoint_every} {keep_last} {metrics_file} {name} {run_dir} (counts left unset are 0); "
        "`{{`/`}}` are braces.")
    shell: bool = Field(default=False, description="Run the command string through /bin/sh -c.")
    cwd: str | None = Field(default=None, description="Working directory of the command, relative to the run "
                            "directory (default: the run directory).")
    log_pattern: list[str] | str | None = Field(
        default=None, description="Regex(es) searched in every output line; named groups are metrics, the group "
        "`step` (or `step_key`) is the step (no step group: steps are counted).")
    metrics_file: str | None = Field(
        default=None, description="A JSONL file the trainer writes, one object per step (relative to the command's "
        "working directory; with `*`, the newest matching file that appears after the start); nested objects are "
        "flattened with '/'.")
    step_key: str = Field(default="step", description="The trainer's name for the step (group or JSON key).")
    metrics_map: dict[str, str] = Field(
        default_factory=dict, description="Trainer key -> rlctl's unified name (e.g. loss = \"policy_loss\"); keys "
        "not mapped are kept as command/<key>.")
    checkpoint_pattern: str | None = Field(
        default=None, description="The name of one checkpoint folder inside checkpoint.dir, with {step} for the step "
        "(`*`/`?` wildcards), or `re:<regex>` with a group for the step.")
    checkpoint_marker: str | None = Field(
        default=None, description="A file inside a checkpoint folder the trainer writes last (a checkpoint is "
        "complete once it exists; {step} allowed).")
    resume_args: list[str] | str | None = Field(
        default=None, description="Arguments appended to resume, with {path} (the checkpoint folder), {step}, {dir} "
        "(checkpoint.dir), e.g. [\"--resume\", \"{path}\"].")
    resume_command: list[str] | str | None = Field(
        default=None, description="A whole other command that resumes (instead of command + resume_args); same "
        "placeholders as resume_args.")
    multi_node: Literal["ray", "torchrun"] | None = Field(
        default=None, description="How the command spans resources.nodes > 1 on a batch cluster: `ray` (it joins the "
        "Ray cluster the job brings up, through RAY_ADDRESS) or `torchrun` (one copy per node, rendezvous on the "
        "first; the default when the command starts with torchrun).")
    logs: dict[str, str] = Field(
        default_factory=dict, description="Logs of the trainer's components besides its output, by component: e.g. "
        "{ inference = \"/tmp/vllm.log\" } (relative paths: to the command's working directory); `rlctl logs RUN "
        "--component NAME` shows them, and an inference log is read for the causes of death.")
    processes: dict[str, str] = Field(
        default_factory=dict, description="A regex over a component's process command line, e.g. { inference = "
        "\"vllm serve\" }: rlctl sees when that process is gone while the trainer lives (docs/resilience.md).")

    @field_validator("log_pattern")
    @classmethod
    def _regexes(cls, v: list[str] | str | None) -> list[str] | str | None:
        for p in [v] if isinstance(v, str) else (v or []):
            try:
                rx = re.compile(p)
            except re.error as e:
                raise ValueError(f"log_pattern {p!r} is not a regex: {e}") from None
            if not rx.groupindex:
                raise ValueError(f"log_pattern {p!r} has no named group: write (?P<loss>\\S+) for a metric")
        return v

    @field_validator("checkpoint_pattern")
    @classmethod
    def _pattern(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                _runner.checkpoint_regex(v)
            except (ValueError, re.error) as e:
                raise ValueError(str(e)) from None
        return v

    @field_validator("metrics_map")
    @classmethod
    def _unified(cls, v: dict[str, str]) -> dict[str, str]:
        return check_unified(v)

    @field_validator("resume_args", "resume_command")
    @classmethod
    def _resume_fields(cls, v: list[str] | str | None) -> list[str] | str | None:
        for arg in _argv(v) if v is not None else []:
            bad = [f for f in _fields(arg) if f not in RESUME_FIELDS]
            if bad:
                raise ValueError(f"{arg!r}: unknown placeholder {{{bad[0]}}}; resume templates take "
                                 + ", ".join(f"{{{f}}}" for f in RESUME_FIELDS))
        return v

    @field_validator("logs", "processes")
    @classmethod
    def _components(cls, v: dict[str, str]) -> dict[str, str]:
        from rlctl.core.components import NAME

        for name, value in v.items():
            if not NAME.fullmatch(name) or name in ("supervisor", "ray"):
                raise ValueError(f"{name!r}: a component name is letters, digits, '_' or '-' (and not supervisor or "
                                 "ray, which are rlctl's own), e.g. inference")
            if not value.strip():
                raise ValueError(f"{name} = {value!r}: empty")
        return v

    @field_validator("processes")
    @classmethod
    def _process_regexes(cls, v: dict[str, str]) -> dict[str, str]:
        for name, p in v.items():
            try:
                re.compile(p)
            except re.error as e:
                raise ValueError(f"processes.{name} = {p!r} is not a regex: {e}") from None
        return v

    @model_validator(mode="after")
    def _command(self) -> CommandOptions:
        if not _argv(self.command):
            raise ValueError("command is empty")
        if self.checkpoint_marker and not self.checkpoint_pattern:
            raise ValueError("checkpoint_marker needs checkpoint_pattern (which folders are checkpoints)")
        if (self.resume_args or self.resume_command) and not self.checkpoint_pattern:
            raise ValueError("resume_args/resume_command need checkpoint_pattern (which folder to resume from)")
        return self
