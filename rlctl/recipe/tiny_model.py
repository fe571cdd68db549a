"""Tiny randomly initialised models with a byte-level tokenizer, made locally: no download, for smoke tests.

A model source `random:qwen2?hidden=64&layers=2` names one; `rlctl model tiny PATH` writes one to disk. Needs the
`[trl]` extra (torch, transformers, tokenizers), imported only here.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from urllib.parse import parse_qsl, urlparse

from rlctl.errors import RecipeError

ARCHS = ("qwen2", "llama")
DEFAULTS = {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 128, "max_positions": 512, "seed": 0}


def parse_random_source(source: str) -> tuple[str, dict[str, int]]:
    """`random:qwen2?hidden=64&layers=2` -> ("qwen2", {...all sizes...})."""
    parsed = urlparse(source)
    if parsed.scheme != "random":
        raise RecipeError(f"model.path {source!r}: not a random: model source.")
    arch = (parsed.path or parsed.netloc or "qwen2").strip("/")
    if arch not in ARCHS:
        raise RecipeError(f"model.path {source!r}: unknown architecture {arch!r}; expected one of {', '.join(ARCHS)}.")
    params = dict(DEFAULTS)
    for k, v in parse_qsl(parsed.query, keep_blank_values=True):
        if k not in DEFAULTS:
            raise RecipeError(f"model.path {source!r}: unknown parameter {k!r}; expected {', '.join(DEFAULTS)}.")
        try:
            params[k] = int(v)
        except ValueError:
            raise RecipeError(f"model.path {source!r}: {k}={v!r} must be an integer.") from None
        if params[k] < (0 if k == "seed" else 1):
            raise RecipeError(f"model.path {source!r}: {k} must be positive.")
    if params["hidden"] % params["heads"] or params["heads"] % params["kv_heads"]:
        raise RecipeError(f"model.path {source!r}: hidden must divide by heads, and heads by kv_heads.")
    return arch, params


def cache_key(source: str) -> str:
    arch, params = parse_random_source(source)
    blob = json.dumps({"arch": arch, **params}, sort_keys=True)
    return f"{arch}-" + hashlib.sha1(blob.encode()).hexdigest()[:10]


def byte_tokenizer():
    """A byte-level BPE tokenizer with no merges: 256 byte tokens plus end-of-text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    eos = "<|endoftext|>"
    vocab[eos] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([eos])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, pad_token=eos, bos_token=None)


def make_tiny(path: str | Path, source: str = "random:qwen2") -> Path:
    """Write a tiny random model + tokenizer to `path` (a directory usable as model.path)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    arch, p = parse_random_source(source)
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = byte_tokenizer()
    common = dict(
        vocab_size=len(tokenizer), hidden_size=p["hidden"], intermediate_size=p["intermediate"],
        num_hidden_layers=p["layers"], num_attention_heads=p["heads"], num_key_value_heads=p["kv_heads"],
        max_position_embeddings=p["max_positions"], tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(p["seed"])
    if arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    else:
        model = LlamaForCausalLM(LlamaConfig(**common))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a model of a few hundred kB: no "Writing model shards" bar on the terminal
    try:
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    finally:
        if was:
            hf_logging.enable_progress_bar()
    (out / "rlctl_tiny.json").write_text(json.dumps({"source": source, "arch": arch, **p}, indent=2) + "\n")
    return out


def model_cache() -> Path:
    """Where `random:` sources are made, once per source: $RLCTL_MODEL_CACHE, else ~/.cache/rlctl/models — one place
    for the launch, its trainer and every eval job, whatever directory each runs in."""
    import os

    if os.environ.get("RLCTL_MODEL_CACHE"):
        return Path(os.environ["RLCTL_MODEL_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rlctl" / "models"


def resolve_model(source: str, cache_dir: Path) -> str:
    """A `random:` source becomes a directory under cache_dir (made once); anything else is returned as is."""
    if not source.startswith("random:"):
        return source
    target = cache_dir / cache_key(source)
    if not (target / "config.json").is_file():
        # built aside and renamed into place: runs started together (a sweep's first slots) never load a model
        # another one is still writing (config.json lands before the weights)
        import os
        import shutil
        import tempfile

        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=cache_dir))
        try:
            make_tiny(tmp, source)
            if target.exists() and not (target / "config.json").is_file():
                shutil.rmtree(target, ignore_errors=True)  # a half-made model from an older rlctl
            try:
                os.rename(tmp, target)
            except OSError:  # another run renamed its own first: the same model (same seed), use it
                if not (target / "config.json").is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return str(target)
