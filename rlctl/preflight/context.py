"""Context budget: prompt + response must fit the context (a violation makes prime-rl hang at "0/8 rollouts"),
and real prompt lengths measured with the model's tokenizer wherever the prompts can be read on this machine (a
local file, an installed verifiers environment's dataset, a `datasets` id in the local cache).

The context is the one the backend gives vLLM (Backend.engine_context: model.max_model_len, or OpenRLHF's prompt +
generate length). The budget counts data.max_prompt_tokens only where the backend enforces it (Backend.prompt_limit);
elsewhere it counts the longest measured prompt, and says the budget is unknown when the prompts could not be
measured: never OK on a number nobody enforces, and no fix computed from one (the fix gives the formula)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlctl.preflight import FAIL, OK, SKIP, WARN, Context, Result, check
from rlctl.recipe.data import hf_cache_dir, prompt_texts

MAX_MEASURED = 20000  # prompts tokenized for the length statistics
MEASURE_HOW = ("measure them: point data.train at a local copy of the prompts (JSONL/Parquet) and model.path at a "
               "local model directory, then `rlctl preflight RECIPE --only context`")


@dataclass
class Lengths:
    """Measured prompt lengths (sorted), or why they are unknown."""

    lengths: list[int] = field(default_factory=list)
    missing: int = 0
    where: str = ""
    unknown: str | None = None  # why nothing was measured
    fix: str | None = None
    verdict: str = SKIP  # what context.prompt_lengths says when unknown

    def q(self, p: float) -> int:
        return self.lengths[min(len(self.lengths) - 1, int(p * len(self.lengths)))]


def _local_tokenizer(model_path: str) -> Path | None:
    p = Path(model_path)
    if p.is_dir() and (p / "tokenizer.json").is_file():
        return p / "tokenizer.json"
    cached = hf_cache_dir("models", model_path)  # a hub id whose tokenizer is already in the local cache
    if cached is not None:
        found = sorted(cached.glob("snapshots/*/tokenizer.json"))
        if found:
            return found[-1]
    return None


def _encoder(model_path: str) -> tuple[Any, str | None, str | None]:
    """(texts -> token counts, or None; why not; the fix)."""
    tok_file = _local_tokenizer(model_path)
    if tok_file is not None:
        try:
            from tokenizers import Tokenizer
        except ImportError:
            return None, "the `tokenizers` package is not installed", "pip install tokenizers"
        tokenizer = Tokenizer.from_file(str(tok_file))
        return (lambda texts: [len(e.ids) for e in tokenizer.encode_batch(texts)]), None, None
    if model_path.startswith("random:"):  # the byte-level tokenizer: one token per UTF-8 byte
        return (lambda texts: [len(t.encode("utf-8")) for t in texts]), None, None
    return None, ("no local tokenizer (model.path is not a local directory with tokenizer.json, nor a model in the "
                  "local Hugging Face cache)"), "download the tokenizer next to config.json to measure prompt lengths"


def measure(ctx: Context) -> Lengths:
    """The prompts' token counts, once per preflight."""
    cached = getattr(ctx, "_prompt_lengths", None)
    if cached is not None:
        return cached
    r = ctx.recipe
    texts, missing, where = prompt_texts(r, MAX_MEASURED)
    if texts is None:
        out = Lengths(unknown=f"prompt lengths not measured: {where}", fix=MEASURE_HOW)
    elif not texts:
        out = Lengths(missing=missing, where=where, verdict=FAIL,
                      unknown=f"no record of {where} has the input key {r.data.input_key!r}",
                      fix="set data.input_key to the prompt field")
    else:
        encode, why, fix = _encoder(r.model.path)
        if encode is None:
            out = Lengths(where=where, unknown=why, fix=fix)
        else:
            out = Lengths(sorted(encode(texts)), missing, where)
    ctx._prompt_lengths = out  # type: ignore[attr-defined]
    return out


@check("context.budget")
def budget(ctx: Context) -> list[Result]:
    """prompt + max_tokens against the context the backend really gives vLLM (Backend.engine_context). The prompt is
    a fact only where the backend enforces data.max_prompt_tokens or the prompts were measured; otherwise the number
    is an assumption, said as such, and no fix is computed from it: the fix gives the formula and how to measure."""
    r = ctx.recipe
    declared = r.data.max_prompt_tokens
    limit = ctx.backend.prompt_limit(r)
    context, sized = ctx.backend.engine_context(r)
    out = []
    data: dict[str, Any] = {"max_prompt_tokens": declared, "max_tokens": r.rollout.max_tokens,
                            "max_model_len": r.model.max_model_len, "engine_context": context,
                            "prompt_limit_enforced": limit is not None}
    prompt, source, known = declared, "max_prompt_tokens", limit is not None
    m = None
    if limit is None:
        m = measure(ctx)
        if m.lengths:
            prompt, source, known = m.lengths[-1], "longest measured prompt", True
            data["longest_prompt"] = prompt
    figure_prompt = f"{source} {prompt}" if known else f"max_prompt_tokens {declared} (not measured)"
    ctx_name = "max_model_len" if sized == "max_model_len" else f"vLLM's context ({sized})"
    need = prompt + r.rollout.max_tokens
    overlong = ctx.backend.overlong_request(r)  # what the recipe's engine does with a request too long for it
    hang = f" ({overlong})"
    if need > context:
        room = context - prompt
        sets: dict[str, Any] | None = None
        # raising max_model_len helps only where it sizes vLLM's context (OpenRLHF sizes it from the lengths)
        raise_len = {"model.max_model_len": need} if sized == "max_model_len" else None
        others = []
        if not known:  # the number would come from an assumed prompt length: the formula, and what to measure
            fix = (f"set rollout.max_tokens <= {context} - the longest prompt in tokens (chat template included); "
                   f"{MEASURE_HOW}")
        elif room > 0:
            fix, sets = f"set rollout.max_tokens <= {room}", {"rollout.max_tokens": room}
            if raise_len:
                others.append((f"set model.max_model_len = {need}", raise_len))
        elif raise_len:
            fix, sets = f"set model.max_model_len = {need}", raise_len
        else:
            fix = "raise model.max_model_len"
        out.append(Result(
            "context.budget", FAIL,
            f"{figure_prompt} + max_tokens {r.rollout.max_tokens} = {need} > {ctx_name} {context}", fix + hang, data,
            set=sets, other_fixes=others))
    elif not known:
        out.append(Result(
            "context.budget", WARN,
            f"prompt lengths unknown: {r.backend.name} does not enforce data.max_prompt_tokens ({declared}), so "
            f"{declared} + {r.rollout.max_tokens} = {need} <= {context} is an assumption "
            f"({m.unknown if m else 'not measured'})",
            f"set data.max_prompt_tokens to what your data needs ({MEASURE_HOW}) or make the dataset local; a "
            f"prompt longer than {context} - {r.rollout.max_tokens} = {context - r.rollout.max_tokens} tokens is "
            f"too long: {overlong}", data))
    else:
        how = f"enforced: {limit}" if limit is not None else f"{len(m.lengths)} prompts of {m.where}"  # type: ignore
        if sized != "max_model_len":
            how += f"; {sized}"
        out.append(Result("context.budget", OK, f"{prompt} + {r.rollout.max_tokens} = {need} <= {context} "
                          f"({source}; {how})", None, data))
    arch = ctx.arch
    if not isinstance(arch, Exception) and context > arch.max_positions:
        # vLLM's _get_and_verify_max_len: "User-specified max_model_len (...) is greater than the derived
        # max_model_len" raises at engine start unless VLLM_ALLOW_LONG_MAX_MODEL_LEN is set
        import os

        allowed = r.env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") or os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN")
        fails = r.uses_vllm and not allowed
        cut = (f"lower data.max_prompt_tokens + rollout.max_tokens to <= {arch.max_positions}"
               if sized != "max_model_len" else f"set model.max_model_len <= {arch.max_positions}")
        out.append(Result("context.positions", FAIL if fails else WARN,
                          f"{ctx_name} {context} > the model's {arch.max_positions} positions"
                          + (": vLLM refuses to start (max_model_len greater than the derived max_model_len)"
                             if fails else ""),
                          cut + (" (or configure rope scaling in the model's config.json)" if fails else
                                 "; positions past the model's are extrapolated"),
                          set={"model.max_model_len": arch.max_positions} if sized == "max_model_len" else None))
    from rlctl.backends import get_backend

    # a backend with no trainer sequence length trains on whole rollouts: nothing is truncated there
    if get_backend(r.backend.name).seq_len_key is not None and r.train_seq_len < need:
        out.append(Result("context.train_seq_len", WARN,
                          f"trainer seq_len {r.train_seq_len} < prompt + response {need}"
                          + ("" if known else " (prompt not measured)")
                          + ": long samples are truncated or dropped in training",
                          f"set train.seq_len >= {need} if memory allows" if known else
                          f"set train.seq_len >= the longest prompt + {r.rollout.max_tokens} if memory allows; "
                          f"{MEASURE_HOW}", set={"train.seq_len": need} if known else None))
    return out


@check("context.prompt_lengths")
def prompt_lengths(ctx: Context) -> Result | None:
    r = ctx.recipe
    m = measure(ctx)
    if not m.lengths:
        return Result("context.prompt_lengths", m.verdict, m.unknown or "prompt lengths not measured", m.fix)
    lengths, n = m.lengths, len(m.lengths)
    over = sum(1 for x in lengths if x > r.data.max_prompt_tokens)
    data = {"n": n, "p50": m.q(0.5), "p99": m.q(0.99), "max": lengths[-1], "over_limit": over,
            "missing_key": m.missing, "source": m.where}
    figure = (f"{n} prompts: p50 {m.q(0.5)}, p99 {m.q(0.99)}, max {lengths[-1]} tokens; "
              f"{over} ({over / n:.1%}) over max_prompt_tokens {r.data.max_prompt_tokens}")
    if m.missing:
        figure += f"; {m.missing} records lack {r.data.input_key!r}"
    if over / n > r.preflight.max_truncated_prompts:
        limit = ctx.backend.prompt_limit(r)
        what = ("these prompts are truncated or dropped" if limit is not None else
                f"{r.backend.name} does not enforce the limit: these prompts reach the engine whole")
        return Result("context.prompt_lengths", WARN, figure,
                      f"{what}: raise data.max_prompt_tokens to >= {m.q(0.99)}", data)
    return Result("context.prompt_lengths", OK, figure, None, data)
