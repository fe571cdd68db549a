"""TRL adapter: the memory engine it declares and what its runner reports."""

from __future__ import annotations

import json

from rlctl.backends import get_backend
from rlctl.backends.trl.runner import report_cuda_memory
from rlctl.recipe.planning import prepare
from tests.conftest import RECIPES


def test_memory_questions():
    trl = get_backend("trl")
    prep = prepare(RECIPES / "quickstart.toml", ["data.max_prompt_tokens=32", "rollout.max_tokens=16"])
    assert trl.sharding == "plain" and trl.logits_scope == "completion"
    assert trl.micro_tokens(prep.recipe, 4) == 4 * 48  # padded to prompt + completion, not max_model_len
    assert trl.param_dtype(prep.recipe) == "float32"


def test_render_carries_precision():
    prep = prepare(RECIPES / "quickstart.toml", ["resources.gpus_per_node=1", "model.precision=pure",
                                                  "model.dtype=bfloat16"])
    cfg = json.loads(prep.backend.render(prep.recipe, prep.dataset_size).files["trl_config.json"])
    assert cfg["precision"] == "pure" and cfg["grpo"]["model_init_kwargs"]["dtype"] == "bfloat16"


def test_runner_reports_nothing_without_cuda(tmp_path, monkeypatch, capsys):
    class NoCuda:
        class cuda:  # noqa: N801
            @staticmethod
            def is_available():
                return False

    monkeypatch.chdir(tmp_path)
    report_cuda_memory(NoCuda)
    assert capsys.readouterr().out == "" and not (tmp_path / "torch_memory.json").exists()


def test_an_unknown_trl_release_is_an_error_not_a_neighbour(cli):
    from tests.conftest import RECIPES

    r = cli("render", str(RECIPES / "quickstart.toml"), "--set", "backend.version=1.15.0")
    assert r.code == 2
    assert "trl 1.15.0 is not known to rlctl; known: 1.16.0" in r.err
    assert "Traceback" not in r.err


def test_lora_on_lm_head_is_refused_as_grpo_trainer_refuses_it():
    # GRPOTrainer raises ValueError at start for an adapter on lm_head (found making the doctor corpus's LoRA run)
    sets = ["lora.rank=8", 'lora.target_modules=["q_proj","lm_head"]']
    errors = [f for f in prepare(RECIPES / "quickstart.toml", sets).validate() if f.level == "error"]
    assert [f.key for f in errors] == ["lora.target_modules"] and "lm_head" in errors[0].message
    ok = prepare(RECIPES / "quickstart.toml", ["lora.rank=8", 'lora.target_modules=["q_proj","v_proj"]']).validate()
    assert not [f for f in ok if f.level == "error"]


def test_several_gpus_start_one_process_each():
    """A TRL recipe on 2 GPUs was started as one process, where GRPOTrainer refuses the DataParallel wrap transformers
    makes: one process per GPU through torch.distributed.run; one GPU or the CPU stays a plain process; several
    nodes are refused at render with the fix."""
    two = prepare(RECIPES / "quickstart.toml", ["resources.gpus_per_node=2", 'resources.gpu="H100-80GB"'])
    argv = two.backend.render(two.recipe, two.dataset_size).argv
    assert argv[:5] == ["python3", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"], argv
    assert argv[5:] == ["-m", "rlctl.backends.trl.runner", "trl_config.json"], argv
    one = prepare(RECIPES / "quickstart.toml", ["resources.gpus_per_node=1", 'resources.gpu="H100-80GB"'])
    assert one.backend.render(one.recipe, one.dataset_size).argv[:3] == ["python3", "-m", "rlctl.backends.trl.runner"]
    cpu = prepare(RECIPES / "quickstart.toml", [])
    assert cpu.backend.render(cpu.recipe, cpu.dataset_size).argv[0:2] == ["python3", "-m"]
    nodes = prepare(RECIPES / "quickstart.toml", ["resources.gpus_per_node=2", 'resources.gpu="H100-80GB"',
                                                  "resources.nodes=2"])
    errs = [f for f in nodes.validate() if f.level == "error" and f.key == "resources.nodes"]
    assert errs and "one node" in errs[0].message, nodes.validate()


def test_the_prompt_limit_trl_does_not_hold_is_said():
    """data.max_prompt_tokens reached the runner's config, which never used it, and render said nothing: TRL 1.16's
    GRPOConfig has no max_prompt_length (read from the release's own source or snapshot), so render notes it; a
    release that has it gets it rendered, and preflight knows it is enforced."""
    trl = get_backend("trl")
    prep = prepare(RECIPES / "quickstart.toml", ["data.max_prompt_tokens=20"])
    assert "max_prompt_length" not in trl.release_fields(prep.recipe)
    notes = [f for f in prep.validate() if f.key == "data.max_prompt_tokens"]
    assert notes and notes[0].level == "note" and "reaches generation whole" in notes[0].message
    assert trl.prompt_limit(prep.recipe) is None
    fields = trl.release_fields(prep.recipe) | {"max_prompt_length"}
    old = type("OldTRL", (type(trl),), {"release_fields": lambda self, recipe: fields})()
    assert old.grpo_config(prep.recipe, None)["max_prompt_length"] == 20
    assert "truncates" in old.prompt_limit(prep.recipe)
    assert not [f for f in old.unhonoured(prep.recipe) if f.key == "data.max_prompt_tokens"]
