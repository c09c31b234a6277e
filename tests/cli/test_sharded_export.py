"""A run whose checkpoints are sharded (``train.checkpoint_layout = "sharded"``) still publishes plain
weights: ``rlvr export`` reads the selected checkpoint's shards whole and writes the PEFT adapter (which
peft loads over the base, equal to ``merged/``) or the full model, and ``rlvr eval`` scores it. An
``adapter_init`` pointed at the shards is refused with the way out."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

pytestmark = pytest.mark.train


# Rewards that differ within a group whatever the tiny model says, so the one step moves the weights.
ENV = """
def make_rows(n, seed=0):
    return [{"prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(n)]


def reward_fn(messages, answer):
    return sum(map(ord, messages[-1]["content"])) % 7 / 7
"""


def config(env: str, lora_rank: int) -> dict:
    return {"loop": {"max_steps": 1, "tasks_per_step": 2, "group_k": 2, "heldout_every": 1, "corpus_min": 20,
                     "heldout_frac": 0.25, "lr": 1e-2, "lora_rank": lora_rank},
            "model": {"hidden": 16, "layers": 1, "heads": 2, "threads": 1},
            "task": {"name": None, "env": env, "n": 40}, "sampler": {"max_new_tokens": 2},
            "train": {"checkpoint_layout": "sharded", "micro_batch": 64}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from rlvr.config.run import run_config_from_dict
    from rlvr.wiring.seams import make_loop

    root = tmp_path_factory.mktemp("sharded_runs")
    env = root / "sumenv.py"
    env.write_text(ENV)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLVR_CACHE", str(root / "cache"))
        for name, rank in (("lora", 4), ("full", 0)):
            make_loop(run_config_from_dict(config(str(env), rank)), root / name, log=lambda _m: None).run()
    return root


@pytest.mark.parametrize("mode", ["lora", "full"])
def test_export_writes_a_sharded_checkpoint_as_plain_weights(runs, mode, tmp_path, monkeypatch):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from rlvr.backends.train.checkpoint_io import is_sharded_checkpoint, load_sharded
    from rlvr.cli.commands import main
    from rlvr.record.run_record import TRAINER_DIR, checkpoint_name
    from rlvr.wiring.seams import saved_config
    from rlvr.wiring.trainer import make_policy

    monkeypatch.setenv("RLVR_CACHE", str(runs / "cache"))
    run = runs / mode
    ckpt = run / checkpoint_name(1) / TRAINER_DIR  # after the step: trained weights (step 0's LoRA is a no-op)
    assert is_sharded_checkpoint(ckpt)
    assert not (ckpt / "adapter").exists() and not (ckpt / "weights.safetensors").exists()
    assert main(["export", str(run), "--step", "1", "--out", str(tmp_path / "x")]) == 0

    policy = make_policy(saved_config(run), run / "base", need_reference=False)  # the shards, read directly
    load_sharded(ckpt, policy.model, None)
    trained = {n: p.detach() for n, p in policy.model.named_parameters() if p.requires_grad}
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "x" / "merged").state_dict()
    if mode == "lora":
        from peft import PeftModel

        adapter = load_file(tmp_path / "x" / "adapter" / "adapter_model.safetensors")
        assert len(adapter) == len(trained) > 0
        for name, value in trained.items():  # peft names the adapter's tensors without the adapter's name
            assert torch.equal(adapter[name.replace(".default", "")], value), name
        over_base = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(run / "base"),
                                              tmp_path / "x" / "adapter").merge_and_unload().state_dict()
        assert over_base.keys() == merged.keys()
        assert all(torch.allclose(over_base[k], merged[k]) for k in merged)
    else:
        assert not (tmp_path / "x" / "adapter").exists()
        for name, value in trained.items():
            assert torch.equal(merged[name], value), name
    base = AutoModelForCausalLM.from_pretrained(run / "base").state_dict()
    assert any(not torch.equal(base[k], merged[k]) for k in merged)  # the trained weights, not the base


def test_eval_scores_a_sharded_checkpoint_and_adapter_init_refuses_it(runs, tmp_path, monkeypatch):
    from rlvr.cli.commands import main
    from rlvr.errors import ConfigError
    from rlvr.record.run_record import TRAINER_DIR, checkpoint_name
    from rlvr.wiring.adapter_init import adapter_folder

    monkeypatch.setenv("RLVR_CACHE", str(runs / "cache"))
    assert main(["eval", str(runs / "lora"), "--step", "1", "--n", "1", "--out", str(tmp_path / "eval.json")]) == 0
    assert json.loads((tmp_path / "eval.json").read_text())["version"] == 1  # the checkpoint's, read from shards
    ckpt = runs / "lora" / checkpoint_name(1) / TRAINER_DIR
    with pytest.raises(ConfigError, match=r"is a sharded checkpoint .*`rlvr export` the run's step"):
        adapter_folder(str(ckpt))
