"""Context budget: prompt + response must fit the context (a violation makes prime-rl hang at "0/8 rollouts"),
and real prompt lengths measured with the model's tokenizer when it is available locally."""

from __future__ import annotations

from pathlib import Path

from rlctl.preflight import FAIL, OK, SKIP, WARN, Context, Result, check
from rlctl.recipe.data import is_local, iter_records, prompt_text

MAX_MEASURED = 20000  # prompts tokenized for the length statistics


@check("context.budget")
def budget(ctx: Context) -> list[Result]:
    r = ctx.recipe
    need = r.data.max_prompt_tokens + r.rollout.max_tokens
    out = []
    data = {"max_prompt_tokens": r.data.max_prompt_tokens, "max_tokens": r.rollout.max_tokens,
            "max_model_len": r.model.max_model_len}
    if need > r.model.max_model_len:
        room = r.model.max_model_len - r.data.max_prompt_tokens
        out.append(Result(
            "context.budget", FAIL,
            f"max_prompt_tokens {r.data.max_prompt_tokens} + max_tokens {r.rollout.max_tokens} = {need} "
            f"> max_model_len {r.model.max_model_len}",
            (f"set rollout.max_tokens <= {room}" if room > 0 else "raise model.max_model_len")
            + " (vLLM rejects such requests: rollouts hang with no error in the main log)", data))
    else:
        out.append(Result("context.budget", OK,
                          f"{r.data.max_prompt_tokens} + {r.rollout.max_tokens} = {need} <= {r.model.max_model_len}",
                          None, data))
    arch = ctx.arch
    if not isinstance(arch, Exception) and r.model.max_model_len > arch.max_positions:
        out.append(Result("context.positions", WARN,
                          f"max_model_len {r.model.max_model_len} > the model's {arch.max_positions} positions",
                          "vLLM refuses this unless rope scaling is configured"))
    if r.train_seq_len < need:
        out.append(Result("context.train_seq_len", WARN,
                          f"trainer seq_len {r.train_seq_len} < prompt + response {need}: long samples are "
                          "truncated or dropped in training",
                          f"set train.seq_len >= {need} if memory allows"))
    return out


def _local_tokenizer(model_path: str) -> Path | None:
    p = Path(model_path)
    if p.is_dir() and (p / "tokenizer.json").is_file():
        return p / "tokenizer.json"
    return None


@check("context.prompt_lengths")
def prompt_lengths(ctx: Context) -> Result | None:
    r = ctx.recipe
    if not is_local(r.data.train):
        return Result("context.prompt_lengths", SKIP, "dataset not local; prompt lengths not measured")
    tok_file = _local_tokenizer(r.model.path)
    encode = None
    if tok_file is not None:
        try:
            from tokenizers import Tokenizer
        except ImportError:
            return Result("context.prompt_lengths", SKIP, "the `tokenizers` package is not installed",
                          "pip install tokenizers")
        tokenizer = Tokenizer.from_file(str(tok_file))

        def encode(texts: list[str]) -> list[int]:
            return [len(e.ids) for e in tokenizer.encode_batch(texts)]
    elif r.model.path.startswith("random:"):
        def encode(texts: list[str]) -> list[int]:  # the byte-level tokenizer: one token per UTF-8 byte
            return [len(t.encode("utf-8")) for t in texts]
    else:
        return Result("context.prompt_lengths", SKIP,
                      "no local tokenizer (model.path is not a local directory with tokenizer.json)",
                      "download the tokenizer next to config.json to measure real prompt lengths")
    texts, missing = [], 0
    for rec in iter_records(r.data.train, limit=MAX_MEASURED):
        t = prompt_text(rec, r.data.input_key)
        if t is None:
            missing += 1
        else:
            texts.append(t)
    if not texts:
        return Result("context.prompt_lengths", FAIL,
                      f"no record has the input key {r.data.input_key!r}", "set data.input_key to the prompt field")
    lengths = sorted(encode(texts))
    n = len(lengths)

    def q(p: float) -> int:
        return lengths[min(n - 1, int(p * n))]

    over = sum(1 for x in lengths if x > r.data.max_prompt_tokens)
    data = {"n": n, "p50": q(0.5), "p99": q(0.99), "max": lengths[-1], "over_limit": over, "missing_key": missing}
    figure = (f"{n} prompts: p50 {q(0.5)}, p99 {q(0.99)}, max {lengths[-1]} tokens; "
              f"{over} ({over / n:.1%}) over max_prompt_tokens {r.data.max_prompt_tokens}")
    if missing:
        figure += f"; {missing} records lack {r.data.input_key!r}"
    if over / n > r.preflight.max_truncated_prompts:
        return Result("context.prompt_lengths", WARN, figure,
                      f"these prompts are truncated or dropped: raise data.max_prompt_tokens to >= {q(0.99)}", data)
    return Result("context.prompt_lengths", OK, figure, None, data)
