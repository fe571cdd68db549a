"""Generation for rlctl's own evaluator: vLLM when it is installed and a GPU is visible, else transformers (so it
runs on a CPU with the quickstart's tiny model). A LoRA checkpoint (an `adapter_config.json` in it) is evaluated on
its base model through peft — no merged copy is written. Imported only by the eval job, never by the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def adapter_base(path: str, base: str | None = None) -> str | None:
    """The base model to load a LoRA adapter directory on (`base`, the run's model, else the one the adapter names),
    or None when `path` is a full model. verl's merger writes adapters that name none (base_model_name_or_path null)."""
    cfg = Path(path) / "adapter_config.json"
    if not cfg.is_file():
        return None
    named = base or json.loads(cfg.read_text()).get("base_model_name_or_path")
    if not named:
        raise ValueError(f"{path} is a LoRA adapter that names no base model, and none was given")
    return named


def tokenizer_dir(path: str, base: str) -> str:
    """Where an adapter's tokenizer is: beside it, else in the HF folder it sits in (verl's merger writes the adapter
    to huggingface/lora_adapter/, the tokenizer verl saved with the checkpoint stays in huggingface/), else the
    base's."""
    for d in (Path(path), Path(path).parent):
        if (d / "tokenizer_config.json").is_file():
            return str(d)
    return base


def engine_name() -> str:
    try:
        import torch
        import vllm  # noqa: F401
    except ImportError:
        return "transformers"
    return "vllm" if torch.cuda.is_available() else "transformers"


def import_engine(engine: str | None) -> None:
    """Import what generation with this engine (None: the one engine_name() picks) needs, now: the eval job does it
    with the collector off (rlctl.core.heavy_imports.imports_frozen)."""
    import torch  # noqa: F401

    if (engine or engine_name()) == "transformers":
        from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401


def load_hf(path: str, base: str | None, dtype: str = "float32") -> tuple[Any, Any]:
    """(model, tokenizer) with transformers; an adapter directory is loaded onto its base with peft."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = getattr(torch, dtype) if dtype in ("float32", "bfloat16", "float16") else torch.float32
    device = "cuda" if torch.cuda.is_available() else "cpu"
    adapter = adapter_base(path, base)
    if adapter is not None:
        from peft import PeftModel

        base_path = adapter
        model = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch_dtype)
        model = PeftModel.from_pretrained(model, path)
        tok_src = tokenizer_dir(path, base_path)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
        tok_src = path if (Path(path) / "tokenizer_config.json").is_file() else (base or path)
    tok = AutoTokenizer.from_pretrained(tok_src)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return model.to(device).eval(), tok


def generate_hf(model: Any, tok: Any, prompts: list[str], n: int, temperature: float, max_tokens: int,
                seed: int, batch: int = 16) -> tuple[list[list[str]], list[list[int]]]:
    """n completions per prompt (greedy at temperature 0), and their lengths in tokens."""
    import torch

    if temperature <= 0 and n > 1:
        # generate() refuses num_return_sequences > 1 without sampling ("Greedy methods ... do not support
        # num_return_sequences different than 1"), as vLLM refuses n > 1: each prompt goes n times, regrouped in
        # order, which is what a greedy pass@k (nondet_proxy_pass@k) measures
        texts, lens = generate_hf(model, tok, [p for p in prompts for _ in range(n)], 1, temperature, max_tokens,
                                  seed, batch)
        return ([sum(texts[i * n:(i + 1) * n], []) for i in range(len(prompts))],
                [sum(lens[i * n:(i + 1) * n], []) for i in range(len(prompts))])
    torch.manual_seed(seed)
    texts: list[list[str]] = []
    lengths: list[list[int]] = []
    device = next(model.parameters()).device
    for i in range(0, len(prompts), batch):
        chunk = prompts[i:i + batch]
        enc = tok(chunk, return_tensors="pt", padding=True).to(device)
        kw: dict[str, Any] = {"max_new_tokens": max_tokens, "num_return_sequences": n,
                              "pad_token_id": tok.pad_token_id}
        kw.update({"do_sample": True, "temperature": temperature, "top_p": 1.0, "top_k": 0} if temperature > 0
                  else {"do_sample": False})
        with torch.no_grad():
            out = model.generate(**enc, **kw)
        new = out[:, enc["input_ids"].shape[1]:]
        for j in range(len(chunk)):
            rows = new[j * n:(j + 1) * n]
            done = []
            for row in rows:
                ids = row.tolist()
                if tok.eos_token_id is not None and tok.eos_token_id in ids:
                    ids = ids[:ids.index(tok.eos_token_id)]
                while ids and ids[-1] == tok.pad_token_id:
                    ids.pop()
                done.append(ids)
            texts.append([tok.decode(ids, skip_special_tokens=True) for ids in done])
            lengths.append([len(ids) for ids in done])
    return texts, lengths


# LoRAConfig.__post_init__ accepts only these max_lora_rank values (vllm/config: 8..64 up to 0.5, then up to 256, then
# 320 and 512 too): any other value is a ValueError, so an adapter's rank is rounded up to the next one
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)


def vllm_max_lora_rank(rank: int) -> int:
    """The least max_lora_rank vLLM accepts that serves an adapter of this rank (the largest where none does: vLLM
    then says so itself)."""
    return next((r for r in VLLM_LORA_RANKS if r >= rank), VLLM_LORA_RANKS[-1])


def load_vllm(path: str, base: str | None, seed: int, dtype: str,
              engine_args: dict[str, Any] | None = None) -> tuple[Any, Any]:
    """(vLLM engine, LoRA request or None): an adapter directory is served on its base with enable_lora.
    `engine_args`: gpu_memory_utilization, max_model_len and max_num_batched_tokens as the run's memory plan sized
    them (rlctl.estimate.gpu_plan): beside a training run vLLM's default 0.9 would not pass its own start check."""
    from vllm import LLM

    kw = dict(engine_args or {})
    adapter = adapter_base(path, base)
    if adapter is None:
        return LLM(model=path, dtype=dtype, seed=seed, **kw), None
    from peft import PeftConfig
    from vllm.lora.request import LoRARequest

    rank = int(getattr(PeftConfig.from_pretrained(path), "r", 16) or 16)
    llm = LLM(model=adapter, tokenizer=tokenizer_dir(path, adapter), dtype=dtype, enable_lora=True,
              max_lora_rank=vllm_max_lora_rank(rank), seed=seed, **kw)
    return llm, LoRARequest("checkpoint", 1, path)


def generate_vllm(llm: Any, lora: Any, prompts: list[str], n: int, temperature: float, max_tokens: int,
                  seed: int) -> tuple[list[list[str]], list[list[int]]]:
    from vllm import SamplingParams

    if temperature <= 0 and n > 1:
        # SamplingParams refuses n > 1 with greedy sampling ("n must be 1 when using greedy sampling"; best_of in
        # older releases): each prompt goes n times as its own request, which is what a greedy pass@k measures
        params = SamplingParams(n=1, temperature=0.0, top_p=1.0, max_tokens=max_tokens, seed=seed)
        outs = llm.generate([p for p in prompts for _ in range(n)], params, lora_request=lora)
        flat = [o.outputs[0] for o in outs]
        groups = [flat[i * n:(i + 1) * n] for i in range(len(prompts))]
    else:
        params = SamplingParams(n=n, temperature=temperature, top_p=1.0, max_tokens=max_tokens, seed=seed)
        groups = [list(o.outputs) for o in llm.generate(prompts, params, lora_request=lora)]
    return [[c.text for c in g] for g in groups], [[len(c.token_ids) for c in g] for g in groups]


class Generator:
    """One loaded model: generate(prompts, n, temperature, max_tokens) for each eval set."""

    def __init__(self, path: str, base: str | None, dtype: str = "float32", seed: int = 0, engine: str | None = None,
                 engine_args: dict[str, Any] | None = None):
        self.path, self.base, self.dtype, self.seed = path, base, dtype, seed
        self.engine_args = dict(engine_args or {})
        self.engine = engine or engine_name()
        self._hf: tuple[Any, Any] | None = None
        self._vllm: tuple[Any, Any] | None = None  # one engine for every set of the job

    def generate(self, prompts: list[Any], n: int, temperature: float,
                 max_tokens: int) -> tuple[list[list[str]], list[list[int]]]:
        if self.engine == "vllm":
            if self._vllm is None:
                dtype = "bfloat16" if self.dtype == "float32" else self.dtype
                self._vllm = load_vllm(self.path, self.base, self.seed, dtype, self.engine_args)
            llm = self._vllm[0]
            texts = chat_texts(prompts, lambda: llm.get_tokenizer())
            return generate_vllm(*self._vllm, texts, n, temperature, max_tokens, self.seed)
        if self._hf is None:
            self._hf = load_hf(self.path, self.base, self.dtype)
        tok = self._hf[1]
        return generate_hf(*self._hf, chat_texts(prompts, lambda: tok), n, temperature, max_tokens, self.seed)


def chat_texts(prompts: list[Any], tokenizer: Any) -> list[str]:
    """Chat-message prompts rendered as the trainer renders them (the tokenizer's chat template with the generation
    prompt: verl's RLHFDataset, TRL's conversational data); text prompts as they are. `tokenizer`: a callable that
    gives it, asked only for chat prompts."""
    if not any(isinstance(p, list) for p in prompts):
        return list(prompts)
    tok = tokenizer()
    if not getattr(tok, "chat_template", None):
        raise ValueError("the eval set's prompts are chat messages and the model's tokenizer has no chat template "
                         "to render them (the trainer could not have either)")
    return [tok.apply_chat_template(p, add_generation_prompt=True, tokenize=False) if isinstance(p, list) else p
            for p in prompts]
