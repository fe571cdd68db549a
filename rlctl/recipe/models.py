"""Model architectures for memory and placement checks: a local config.json, a `random:` model, or a table of
well-known models (their public Hugging Face config values). Parameter counts are computed, not guessed."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rlctl.errors import RecipeError


@dataclass(frozen=True)
class Arch:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tie_embeddings: bool = False
    head_dim: int | None = None
    qkv_bias: bool = False
    experts: int = 0  # MoE: routed experts per layer (0 = dense)
    experts_per_token: int = 0
    expert_intermediate: int = 0
    max_positions: int = 32768
    weight_bytes_on_disk: float | None = None  # e.g. MXFP4 experts: what vLLM holds natively
    model_type: str | None = None  # config.json's model_type: the family, which names the modules

    @property
    def linear_modules(self) -> tuple[str, ...] | None:
        """The linear layers peft's "all-linear" adapts (every one but the output layer), from the family; None where
        rlctl does not know an MoE family's names."""
        if self.model_type in FAMILY_MODULES:
            return FAMILY_MODULES[self.model_type]
        return None if self.experts else DENSE_LINEAR

    @property
    def lora_modules(self) -> tuple[str, ...] | None:
        """The modules peft can adapt when named (a target_modules entry matches a module whose name ends in one):
        the linear layers and the embedding and output layers."""
        linear = self.linear_modules
        return None if linear is None else (*linear, *EDGE_MODULES)

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def attention_params(self) -> int:
        q = self.hidden * self.heads * self.hd
        kv = 2 * self.hidden * self.kv_heads * self.hd
        o = self.heads * self.hd * self.hidden
        bias = (self.heads + 2 * self.kv_heads) * self.hd if self.qkv_bias else 0
        return q + kv + o + bias

    @property
    def mlp_params(self) -> int:
        if self.experts:
            return self.experts * 3 * self.hidden * self.expert_intermediate + self.hidden * self.experts
        return 3 * self.hidden * self.intermediate

    @property
    def params(self) -> int:
        per_layer = self.attention_params + self.mlp_params + 2 * self.hidden
        embed = self.vocab * self.hidden * (1 if self.tie_embeddings else 2)
        return self.layers * per_layer + embed + self.hidden

    @property
    def active_params(self) -> int:
        if not self.experts:
            return self.params
        active_mlp = self.experts_per_token * 3 * self.hidden * self.expert_intermediate
        per_layer = self.attention_params + active_mlp + 2 * self.hidden
        return self.layers * per_layer + self.vocab * self.hidden * (1 if self.tie_embeddings else 2)

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        return 2 * self.layers * self.kv_heads * self.hd * dtype_bytes

    def lora_params(self, rank: int, targets: list[str] | str) -> int:
        """LoRA adds rank * (in + out) per targeted projection per layer."""
        hd = self.hd
        shapes = {
            "q_proj": (self.hidden, self.heads * hd), "k_proj": (self.hidden, self.kv_heads * hd),
            "v_proj": (self.hidden, self.kv_heads * hd), "o_proj": (self.heads * hd, self.hidden),
            "gate_proj": (self.hidden, self.intermediate), "up_proj": (self.hidden, self.intermediate),
            "down_proj": (self.intermediate, self.hidden),
        }
        names = list(shapes) if targets == "all-linear" else list(targets)
        total = 0
        for n in names:
            if n in shapes:
                i, o = shapes[n]
                total += rank * (i + o)
        return total * self.layers


# the linear layers of the dense decoder architectures rlctl knows (Llama, Qwen2/2.5/3, Mistral): what peft's
# "all-linear" selects there, and the names a list may give
DENSE_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# the input embedding and the output layer: peft adapts them when a list names them (0.21: LoRA on nn.Embedding and
# on lm_head's nn.Linear), while "all-linear" leaves the output layer out
EDGE_MODULES = ("embed_tokens", "lm_head")
# MoE families whose modules rlctl knows (transformers' modeling code): gpt-oss's experts hold gate_up_proj/down_proj
# as parameters of one GptOssExperts module and its router is a GptOssTopKRouter, neither an nn.Linear peft adapts
FAMILY_MODULES = {"gpt_oss": ("q_proj", "k_proj", "v_proj", "o_proj")}


def weight_modules(path: str) -> tuple[str, ...] | None:
    """The names of the modules peft can adapt behind a local model's weights (its safetensors/bin index's weight
    names, `...q_proj.weight` -> `q_proj`), or None where no index is here. Normalization layers are left out (peft
    adapts Linear, Embedding and Conv layers: LoRA on an RMSNorm is refused at start); a model whose output layer
    shares the input embedding's weights (tie_word_embeddings) saves no lm_head weight, yet has the module."""
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        f = Path(path) / index
        try:
            names = json.loads(f.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(names, dict):
            leaves = [k.split(".")[-2] for k in names if isinstance(k, str) and k.endswith(".weight") and "." in k]
            kept = [n for n in leaves if not n.isdigit() and "norm" not in n.lower()]
            if "embed_tokens" in kept and "lm_head" not in kept:
                kept.append("lm_head")  # tied: the output layer is a Linear over the embedding's weights
            return tuple(dict.fromkeys(kept))
    return None


# Public config.json values of the models the seeds and the docs use.
KNOWN: dict[str, Arch] = {a.name.lower(): a for a in [
    Arch("Qwen/Qwen2.5-0.5B", 896, 24, 14, 2, 4864, 151936, True, qkv_bias=True, max_positions=32768),
    Arch("Qwen/Qwen2.5-1.5B", 1536, 28, 12, 2, 8960, 151936, True, qkv_bias=True, max_positions=32768),
    Arch("Qwen/Qwen2.5-3B", 2048, 36, 16, 2, 11008, 151936, True, qkv_bias=True, max_positions=32768),
    Arch("Qwen/Qwen2.5-7B", 3584, 28, 28, 4, 18944, 152064, False, qkv_bias=True, max_positions=32768),
    Arch("Qwen/Qwen2.5-Math-1.5B", 1536, 28, 12, 2, 8960, 151936, True, qkv_bias=True, max_positions=4096),
    Arch("Qwen/Qwen2.5-Math-7B", 3584, 28, 28, 4, 18944, 152064, False, qkv_bias=True, max_positions=4096),
    Arch("Qwen/Qwen3-4B", 2560, 36, 32, 8, 9728, 151936, True, head_dim=128, max_positions=40960),
    Arch("Qwen/Qwen3-8B", 4096, 36, 32, 8, 12288, 151936, False, head_dim=128, max_positions=40960),
    Arch("meta-llama/Llama-3.1-8B", 4096, 32, 32, 8, 14336, 128256, False, max_positions=131072),
    Arch("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", 1536, 28, 12, 2, 8960, 151936, False, qkv_bias=True,
         max_positions=131072),
    Arch("openai/gpt-oss-20b", 2880, 24, 64, 8, 2880, 201088, False, head_dim=64, qkv_bias=True, experts=32,
         experts_per_token=4, expert_intermediate=2880, max_positions=131072, weight_bytes_on_disk=13.8e9,
         model_type="gpt_oss"),
    Arch("openai/gpt-oss-120b", 2880, 36, 64, 8, 2880, 201088, False, head_dim=64, qkv_bias=True, experts=128,
         experts_per_token=4, expert_intermediate=2880, max_positions=131072, weight_bytes_on_disk=65.3e9,
         model_type="gpt_oss"),
]}
# Instruct / base variants share the architecture.
for _k, _a in list(KNOWN.items()):
    for suffix in ("-instruct", "-base"):
        KNOWN.setdefault(_k + suffix, _a)
KNOWN.setdefault("meta-llama/llama-3.1-8b-instruct", KNOWN["meta-llama/llama-3.1-8b"])


def from_config(cfg: dict, name: str) -> Arch:
    if not isinstance(cfg, dict):
        raise RecipeError(f"{name}: config.json holds a {type(cfg).__name__}, expected a JSON object of model "
                          "settings (hidden_size, num_hidden_layers, ...).",
                          hint="re-download the model's config.json.")
    text = cfg.get("text_config") or cfg
    if not isinstance(text, dict):
        raise RecipeError(f"{name}: config.json's text_config is not a JSON object.",
                          hint="re-download the model's config.json.")
    arch = _arch_from(text, name)
    for field_name, key in (("hidden", "hidden_size"), ("layers", "num_hidden_layers"),
                            ("heads", "num_attention_heads"), ("kv_heads", "num_key_value_heads"),
                            ("vocab", "vocab_size")):
        if getattr(arch, field_name) < 1:
            raise RecipeError(f"{name}: config.json has {key} = {getattr(arch, field_name)}; it must be >= 1.",
                              hint="the config is damaged: re-download the model's config.json.")
    for field_name, key in (("hidden", "hidden_size"), ("layers", "num_hidden_layers"), ("vocab", "vocab_size"),
                            ("intermediate", "intermediate_size"), ("heads", "num_attention_heads")):
        if getattr(arch, field_name) > 10**8:
            raise RecipeError(f"{name}: config.json has {key} = {getattr(arch, field_name)}, which no model has.",
                              hint="the config is damaged: re-download the model's config.json.")
    if arch.head_dim is not None and arch.head_dim < 1:
        raise RecipeError(f"{name}: config.json has head_dim = {arch.head_dim}; it must be >= 1.",
                          hint="re-download the model's config.json.")
    if arch.heads % arch.kv_heads:
        raise RecipeError(f"{name}: config.json has {arch.heads} attention heads, not a multiple of "
                          f"{arch.kv_heads} key/value heads.", hint="re-download the model's config.json.")
    return arch


def _arch_from(text: dict, name: str) -> Arch:
    try:
        experts = int(text.get("num_local_experts") or text.get("num_experts") or 0)
        return Arch(
            name=name,
            hidden=int(text["hidden_size"]),
            layers=int(text["num_hidden_layers"]),
            heads=int(text["num_attention_heads"]),
            kv_heads=int(text.get("num_key_value_heads") or text["num_attention_heads"]),
            intermediate=int(text.get("intermediate_size") or 4 * text["hidden_size"]),
            vocab=int(text["vocab_size"]),
            tie_embeddings=bool(text.get("tie_word_embeddings", False)),
            head_dim=int(text["head_dim"]) if text.get("head_dim") is not None else None,
            qkv_bias=bool(text.get("attention_bias", text.get("model_type") in ("qwen2",))),
            experts=experts,
            experts_per_token=int(text.get("num_experts_per_tok") or 0),
            expert_intermediate=int(text.get("moe_intermediate_size") or text.get("intermediate_size") or 0),
            max_positions=derived_max_len(text),
            model_type=str(text.get("model_type")) if text.get("model_type") else None,
        )
    except KeyError as e:
        raise RecipeError(f"{name}: config.json lacks {e}, a field rlctl needs.",
                          hint="re-download the model's config.json.") from None
    except (TypeError, ValueError, OverflowError, AttributeError) as e:
        raise RecipeError(f"{name}: config.json has a field of the wrong type ({e}).",
                          hint="re-download the model's config.json.") from None


# the config keys vLLM reads a model's length from, the smallest present wins (vllm/config.py _get_and_verify_max_len)
LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
               "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")


def derived_max_len(cfg: dict) -> int:
    """The longest context vLLM starts with for this config.json (vllm/config.py _get_and_verify_max_len): the
    smallest length key, model_max_length where given, times the RoPE scaling factor (yarn: of its
    original_max_position_embeddings) unless the rope type is su/longrope/llama3 or the model gemma3 (already
    scaled). A tokenizer_config.json model_max_length could only lower it. 32768 when no key is there."""
    found = [int(cfg[k]) for k in LENGTH_KEYS if isinstance(cfg.get(k), int | float) and cfg[k] > 0]
    length = float(min(found)) if found else 32768.0
    if isinstance(cfg.get("model_max_length"), int | float) and cfg["model_max_length"] > 0:
        length = float(cfg["model_max_length"])
    rope = cfg.get("rope_scaling")
    if isinstance(rope, dict) and "gemma3" not in str(cfg.get("model_type", "")):
        kind = rope.get("rope_type", rope.get("type"))
        factor = rope.get("factor", 1.0)
        if kind not in ("su", "longrope", "llama3") and isinstance(factor, int | float):
            original = rope.get("original_max_position_embeddings")
            if kind == "yarn" and isinstance(original, int | float):
                length = float(original)
            length *= factor
    return int(length)


def resolve_arch(path: str) -> Arch:
    """The architecture behind model.path, or a RecipeError that says how to provide it."""
    if path.startswith("random:"):
        from rlctl.recipe.tiny_model import parse_random_source

        arch, p = parse_random_source(path)
        return Arch(path, p["hidden"], p["layers"], p["heads"], p["kv_heads"], p["intermediate"], 257, True,
                    qkv_bias=arch == "qwen2", max_positions=p["max_positions"])
    local = Path(path)
    try:
        is_dir = local.is_dir()
    except (OSError, ValueError):
        is_dir = False
    if is_dir:
        cfg_file = local / "config.json"
        if not cfg_file.is_file():
            raise RecipeError(f"{path}: a local model directory without config.json.")
        from rlctl.recipe.loader import read_regular_file

        raw = read_regular_file(cfg_file, 16 * 1024 * 1024, "a model config.json")
        try:
            cfg = json.loads(raw)
        except (ValueError, RecursionError) as e:
            raise RecipeError(f"{cfg_file}: not valid JSON ({e}).",
                              hint="re-download the model's config.json.") from None
        return from_config(cfg, path)
    arch = KNOWN.get(path.lower())
    if arch is None:
        raise RecipeError(
            f"model {path!r} is not in rlctl's table of known models, so its size is unknown.",
            hint="point model.path at a local directory with its config.json (huggingface-cli download "
                 f"{path} config.json --local-dir DIR), or check the spelling.",
        )
    return arch
