"""LoRA: the target modules exist in the model (peft refuses a list that matches none: NoMatchingPeftModuleError), and
the backend's weight sync can give a LoRA actor's weights to its inference engines (the adapter knows)."""

from __future__ import annotations

from rlctl.preflight import FAIL, OK, WARN, Context, Result, check

# the linear layers of the dense decoder architectures rlctl knows (Llama, Qwen2/2.5/3, Mistral): what peft's
# "all-linear" selects there, and the names a list may give (peft matches a module whose name ends in one of them)
DENSE_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@check("lora.targets")
def targets(ctx: Context) -> Result | None:
    r = ctx.recipe
    if r.lora is None or r.lora.target_modules == "all-linear":
        return None
    arch = ctx.arch
    if isinstance(arch, Exception) or arch.experts:  # module names of MoE models differ by family: not judged
        return None
    wanted = list(r.lora.target_modules)
    found = [t for t in wanted if t in DENSE_LINEAR]
    missing = [t for t in wanted if t not in DENSE_LINEAR]
    if not found:
        return Result("lora.targets", FAIL, f"lora.target_modules {wanted}: no such module in {arch.name} "
                      f"(its linear layers: {', '.join(DENSE_LINEAR)}); peft refuses it at start "
                      "(NoMatchingPeftModuleError)", 'set lora.target_modules = "all-linear" (or name its layers)',
                      set={"lora.target_modules": "all-linear"})
    if missing:
        return Result("lora.targets", WARN, f"lora.target_modules {missing}: no such module in {arch.name}; peft "
                      f"adapts only {found}", f"drop {missing}", set={"lora.target_modules": found})
    return Result("lora.targets", OK, f"{len(found)} of {arch.name}'s linear layer kinds adapted")


@check("lora.vllm_sync", hosts="lora")
def vllm_sync(ctx: Context) -> list[Result]:
    r = ctx.recipe
    if r.lora is None or not r.uses_vllm:
        return []
    return ctx.backend.preflight(ctx, "lora")
