"""What verl's workers need beside verl where they run, found before a GPU does (issue 31; docs/gpu.md).

FlashAttention without flash-attn: on an H100 without the flash-attn package, every verl
0.9.1 worker stopped at its model's load ("FlashAttention2 has been toggled on, but ... the package for
FlashAttention2 doesn't seem to be installed", docs/gpu/verl-2.json) after Ray and vLLM had started, and rlctl had
said nothing. verl's own code decides which attention each model gets (released wheel, Hydra compose of its config,
its HFModelConfig and transformers' own from_pretrained, on this CPU); rlctl's adapter must say the same at render
and fail preflight where the workers would. The kit's flash-attn stand-in (OpenRLHF imports flash_attn.bert_padding
at load) is held to transformers' pure-torch copies of flash-attn's helpers and must never pass for FlashAttention-2.

TRL beside verl: verl's workers import TRL's value-head model at every model build whenever TRL is importable, and
TRL 1.13 removed it; the GPU kit's verl stack lay on the TRL stack's 1.16 (found on a CPU by `kit.py cpucheck verl`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from rlctl.backends import get_backend
from rlctl.recipe.loader import load

ROOT = Path(__file__).resolve().parents[1]
KIT = ROOT / "scripts" / "gpu"
SDPA = '"+actor_rollout_ref.model.override_config.attn_implementation" = "sdpa"'

pytest.importorskip("hydra")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

VERL_RECIPE = """
name = "fa"
[backend]
name = "verl"
version = "0.9.1"
[backend.verl.extra]
{extra}
[model]
path = "{model}"
dtype = "bfloat16"
max_model_len = 256
[data]
train = "{data}"
input_key = "prompt"
label_key = "ground_truth"
max_prompt_tokens = 32
[rollout]
group_size = 4
prompts_per_step = 4
max_tokens = 32
gpu_memory_utilization = 0.3
[algorithm]
name = "{algo}"
[train]
steps = 2
train_batch_size = 16
micro_batch_size = 4
[resources]
gpus_per_node = 1
gpu = "H100-80GB"
executor = "{executor}"
[checkpoint]
dir = "checkpoints"
"""

# in a fresh interpreter: verl 0.9.1's own compose and model config, then transformers' own model load
WORKER = r"""
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from tests.conformance import _verl_support as vs
vs.STUBBED = tuple(m for m in vs.STUBBED if m != "flash_attn")  # transformers asks for the real package
root = vs.verl_root("0.9.1")
vs._install(root)
from hydra import compose, initialize_config_dir
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.model import get_hf_auto_model_class
out = {}
for name, overrides in json.loads(sys.stdin.read()).items():
    with initialize_config_dir(config_dir=str(root / "verl/trainer/config"), version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    mc = omega_conf_to_dataclass(cfg.actor_rollout_ref.model)
    out[name] = {}
    try:  # as the FSDP engine's _build_module loads the actor and the reference, then patches it
        m = get_hf_auto_model_class(hf_config=mc.hf_config).from_pretrained(
            mc.local_path, config=mc.hf_config, trust_remote_code=False)
        out[name]["loaded"] = m.config._attn_implementation
        from verl.models.transformers.monkey_patch import apply_monkey_patch
        apply_monkey_patch(model=m, use_remove_padding=mc.use_remove_padding, ulysses_sp_size=1)
        out[name]["patched"] = True
    except ImportError as e:
        out[name]["patch_error" if "loaded" in out[name] else "error"] = str(e)
print("@@" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from rlctl.recipe.tiny_model import make_tiny
    from tests.conformance import _verl_support as vs

    path = vs.CACHE / "tiny-qwen2"
    if not (path / "config.json").is_file():
        make_tiny(path)
    return path


def _recipe(tmp_path: Path, tiny: Path, *, sdpa: bool, algo: str = "grpo", executor: str = "local") -> Path:
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "a", "ground_truth": "a"}\n' * 16)
    p = tmp_path / f"fa-{sdpa}-{algo}-{executor}.toml"
    p.write_text(VERL_RECIPE.format(extra=SDPA if sdpa else "", model=tiny, data=data, algo=algo, executor=executor))
    return p


def test_verl_loads_flash_attention_2_unless_told_and_rlctl_says_which(tmp_path, tiny):
    """verl 0.9.1's own HFModelConfig and transformers' own load: the recipe without the override stops at the load
    as on the H100 (flash-attn is not installed here either); with it, sdpa loads. rlctl's adapter names the same
    attention for both."""
    verl = get_backend("verl")
    cases = {}
    for sdpa in (False, True):
        r = load(_recipe(tmp_path, tiny, sdpa=sdpa)).recipe
        cases[str(sdpa)] = verl.render(r).argv[3:]
        assert verl.attention(r) == {"actor and reference model": "sdpa" if sdpa else "flash_attention_2"}
    got = _verl_worker(tmp_path, cases, trl_site=_trl_site("1.12.0"))
    assert "FlashAttention2" in got["False"]["error"] and "installed" in got["False"]["error"]
    assert got["True"] == {"loaded": "sdpa", "patched": True}  # with TRL 1.12 in front, as the kit's verl overlay


def _verl_worker(tmp_path: Path, cases: dict, trl_site: Path | None = None) -> dict:
    env = {**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1"}
    if trl_site is not None:
        env["PYTHONPATH"] = f"{trl_site}:{env.get('PYTHONPATH', '')}"
    p = subprocess.run([sys.executable, "-c", WORKER, str(ROOT)], input=json.dumps(cases), capture_output=True,
                       text=True, cwd=tmp_path, timeout=600, env=env)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("@@")]
    assert p.returncode == 0 and lines, p.stderr[-3000:]
    return json.loads(lines[-1][2:])


def _trl_site(version: str) -> Path:
    """A released TRL unpacked (pip download --no-deps, cached beside the other fetched wheels)."""
    from tests.conformance import _verl_support as vs

    site = vs.CACHE / "unpacked" / f"trl-{version}"
    if not (site / "trl" / "__init__.py").is_file():
        wheels = vs.CACHE / "wheels"
        found = sorted(wheels.glob(f"trl-{version}-*.whl"))
        if not found:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels),
                            f"trl=={version}"], capture_output=True, text=True, timeout=300)
            found = sorted(wheels.glob(f"trl-{version}-*.whl"))
        assert found, f"cannot download trl=={version}"
        zipfile.ZipFile(found[0]).extractall(site)
    return site


def test_a_trl_without_the_value_head_stops_verls_workers_and_preflight_says_it(tmp_path, tiny, cli):
    """verl 0.9.1's own model patch with TRL 1.16 importable (this environment's, as the GPU kit's verl stack had it
    from its base): ImportError at every model build (with TRL 1.12 in front the patch runs: the test above).
    Preflight says it where verl is installed beside such a TRL (a real verl wheel unpacked)."""
    pytest.importorskip("trl")
    from rlctl.backends._static import installed_version
    from rlctl.backends.base import version_key
    from rlctl.backends.verl import TRL_WITHOUT_VALUE_HEAD

    if version_key(installed_version("trl") or "0") < version_key(TRL_WITHOUT_VALUE_HEAD):
        pytest.skip("the TRL here still has the value-head model")
    verl = get_backend("verl")
    cases = {"sdpa": verl.render(load(_recipe(tmp_path, tiny, sdpa=True)).recipe).argv[3:]}
    got = _verl_worker(tmp_path, cases)
    assert got["sdpa"]["loaded"] == "sdpa" and "AutoModelForCausalLMWithValueHead" in got["sdpa"]["patch_error"]
    from tests.conformance import _verl_support as vs

    root = vs.verl_root("0.9.1")  # verl installed: its dist-info on the path, nothing imported
    code = ("import sys, json; from rlctl.cli import main; sys.argv = ['rlctl', 'preflight', sys.argv[1], '--json']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n")
    p = subprocess.run([sys.executable, "-c", code, str(_recipe(tmp_path, tiny, sdpa=True))], capture_output=True,
                       text=True, timeout=300, env={**os.environ, "PYTHONPATH": f"{root}:{ROOT}"}, cwd=tmp_path)
    res = {x["check"]: x for x in json.loads(p.stdout)["results"]}
    assert res["env.verl_trl"]["verdict"] == "fail" and "trl<1.13" in res["env.verl_trl"]["fix"], p.stdout[-2000:]
    assert "env.verl_trl" not in {x["check"] for x in json.loads(cli("preflight", str(_recipe(
        tmp_path, tiny, sdpa=True)), "--json").out)["results"]}  # no verl here: not verl's environment


def _flash(cli, recipe: Path) -> dict:
    r = cli("preflight", str(recipe), "--json")
    return next(x for x in json.loads(r.out)["results"] if x["check"] == "env.flash_attn")


def test_preflight_fails_where_verls_workers_would_and_render_says_it(cli, tmp_path, tiny):
    """Without flash-attn on this machine: the default attention fails preflight with the fix (the key the kit's GPU
    recipe sets), sdpa passes, a cluster rlctl cannot see gets a warning, and PPO's critic (always FlashAttention-2
    in verl) is named even with sdpa. Render says it whatever the machine."""
    if importlib.util.find_spec("flash_attn"):
        pytest.skip("flash-attn is installed here")
    fa = _flash(cli, _recipe(tmp_path, tiny, sdpa=False))
    assert fa["verdict"] == "fail" and "flash_attention_2" in fa["figure"] and "flash-attn" in fa["figure"]
    assert SDPA.split(" = ")[0].strip('"') in fa["fix"]
    rendered = cli("render", str(_recipe(tmp_path, tiny, sdpa=False))).out
    assert "verl loads the actor and reference model with flash_attention_2 (its default)" in rendered
    ok = _flash(cli, _recipe(tmp_path, tiny, sdpa=True))
    assert ok["verdict"] == "ok" and "sdpa" in ok["figure"]
    assert "flash_attention" not in cli("render", str(_recipe(tmp_path, tiny, sdpa=True))).out
    remote = _flash(cli, _recipe(tmp_path, tiny, sdpa=False, executor="ray"))
    assert remote["verdict"] == "warn" and "not checked from here" in remote["figure"]
    critic = _flash(cli, _recipe(tmp_path, tiny, sdpa=True, algo="ppo"))
    assert critic["verdict"] == "fail" and "critic" in critic["figure"] and "grpo" in critic["fix"]


def test_the_flash_attn_standin_is_transformers_padding_and_no_flash_attention(tmp_path):
    """The kit's stand-in wheel: flash_attn.bert_padding and flash_attn.utils.distributed only, under a distribution
    that is not `flash-attn` (transformers' is_flash_attn_2_available stays False), its padding helpers equal to
    transformers' pure-torch copies of flash-attn's (values and gradient), the kernels absent."""
    sys.path.insert(0, str(KIT))
    import standins

    wheel = standins.build_standin("flash-attn-standin", tmp_path / "w")
    names = zipfile.ZipFile(wheel).namelist()
    assert "flash_attn/bert_padding.py" in names and "flash_attn/utils/distributed.py" in names
    assert not [n for n in names if "flash_attn_interface" in n or "/ops/" in n]
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = r"""
import importlib.metadata as md, torch, transformers.modeling_flash_attention_utils as hf
from transformers.utils import is_flash_attn_2_available
from flash_attn.bert_padding import index_first_axis, pad_input, unpad_input
import flash_attn.utils.distributed
assert md.packages_distributions()["flash_attn"] == ["flash-attn-standin"]
assert not is_flash_attn_2_available()
torch.manual_seed(0)
x = torch.randn(3, 6, 4, requires_grad=True)
mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1], [0, 1, 1, 0, 0, 0]])
ours, theirs = unpad_input(x, mask), hf._unpad_input(x, mask)
assert all(torch.equal(a, b) if torch.is_tensor(a) else a == b for a, b in zip(ours, theirs, strict=True))
assert torch.equal(pad_input(ours[0], ours[1], 3, 6), hf._pad_input(theirs[0], theirs[1], 3, 6))
flat = x.reshape(18, 4)
assert torch.equal(index_first_axis(flat, ours[1]), hf._index_first_axis(x, theirs[1]))
pad_input(ours[0], ours[1], 3, 6).sum().backward()
assert torch.equal(x.grad, mask.unsqueeze(-1).expand_as(x).float())
for mod in ("flash_attn.ops.triton.cross_entropy", "flash_attn.flash_attn_interface"):
    try:
        __import__(mod)
        raise SystemExit(mod + " imports")
    except ImportError:
        pass
print("ok")
"""
    env = {**os.environ, "PYTHONPATH": str(site)}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert p.stdout.strip() == "ok", p.stderr[-3000:]
