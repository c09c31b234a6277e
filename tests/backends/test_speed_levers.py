"""The levers that make a step fast change its cost, never its numbers: each is compared with the
plain path on the tiny model."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

import torch  # noqa: E402

from rlvr.backends.model.policy import LoraSpec, Policy  # noqa: E402
from rlvr.backends.model.tiny import build_tiny_model  # noqa: E402
from rlvr.backends.sample.batched import sample_batch  # noqa: E402
from rlvr.backends.sample.prefix import shared_prompt_cache  # noqa: E402
from rlvr.types import SamplingParams  # noqa: E402

pytestmark = pytest.mark.train


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    base = build_tiny_model(tmp_path_factory.mktemp("tiny") / "base", hidden=32, layers=2, heads=2, seed=0)
    policy = Policy(str(base), lora=LoraSpec(rank=4, alpha=8.0))
    with torch.no_grad():  # a trained-looking adapter, so the LoRA path changes the numbers
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(name)))
    return policy


def _prompts(policy, k):
    tok = policy.tokenizer
    texts = ["12+7=", "3+4=", "100+250=", "9+9="]
    return [list(tok(t)["input_ids"]) for t in texts for _ in range(k)]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_shared_prompts_sample_what_per_row_prompts_sample(policy, temperature):
    prompts = _prompts(policy, 3)
    assert len({len(p) for p in prompts}) > 1  # left padding is exercised
    params = SamplingParams(max_tokens=6, temperature=temperature)
    common = dict(seed=list(range(len(prompts))), eos_ids=policy.eos_ids, pad_id=policy.tokenizer.pad_token_id)
    shared = sample_batch(policy.model, prompts, params, share_prompts=True, **common)
    alone = sample_batch(policy.model, prompts, params, share_prompts=False, **common)
    assert [c.ids for c in shared] == [c.ids for c in alone]
    for a, b in zip(shared, alone, strict=True):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)
        assert a.stop_reason == b.stop_reason


def test_no_cache_without_a_repeated_prompt(policy):
    prompts = _prompts(policy, 1)
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    assert shared_prompt_cache(policy.model, ids, mask) is None
    cache = shared_prompt_cache(policy.model, ids.repeat(2, 1), mask.repeat(2, 1))
    assert cache is not None and cache.get_seq_length() == width - 1


def _train_batch(policy, k=2):
    from rlvr.backends.train.trainer import pack
    from rlvr.testing import batch_of
    from rlvr.types import Rollout

    prompts = _prompts(policy, k)
    outs = sample_batch(policy.model, prompts, SamplingParams(max_tokens=5, temperature=1.0), seed=3,
                        eos_ids=policy.eos_ids, pad_id=policy.tokenizer.pad_token_id)
    rollouts = [Rollout(task_id=str(i), prompt_ids=tuple(p), completion_ids=o.ids, logprobs=o.logprobs, text="",
                        messages=()) for i, (p, o) in enumerate(zip(prompts, outs, strict=True))]
    credited = batch_of(rollouts, [1.0 if i % 2 else -0.5 for i in range(len(rollouts))]).rollouts
    assert len({len(r.prompt_ids) + len(r.completion_ids) for r in credited}) > 1  # padding to remove
    return pack(credited, policy.tokenizer.pad_token_id, "cpu")


def _logp_and_grads(policy, batch, **kwargs):
    from rlvr.backends.train.trainer import completion_logprobs

    policy.model.zero_grad(set_to_none=True)
    logp, entropy = completion_logprobs(policy.model, batch, 0.7, with_entropy=True, **kwargs)
    ((logp * batch["advantages"]).sum() + 0.1 * (entropy * batch["mask"]).sum()).backward()
    grads = {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}
    policy.model.zero_grad(set_to_none=True)
    return logp.detach(), entropy.detach(), grads


def test_packed_rows_give_the_padded_log_probs_entropies_and_gradients(policy):
    batch = _train_batch(policy)
    logp, entropy, grads = _logp_and_grads(policy, batch)
    p_logp, p_entropy, p_grads = _logp_and_grads(policy, batch, packed=True)
    assert torch.allclose(logp, p_logp, atol=1e-5) and torch.allclose(entropy, p_entropy, atol=1e-5)
    assert (p_logp[batch["mask"] == 0] == 0).all()
    assert grads.keys() == p_grads.keys() and grads
    for name, g in grads.items():
        assert torch.allclose(g, p_grads[name], atol=1e-5, rtol=1e-4), name


@pytest.mark.parametrize("split", [True, False], ids=["body-and-head", "whole-model"])
def test_shared_prompts_give_the_padded_log_probs_entropies_and_gradients(policy, split, monkeypatch):
    from rlvr.backends.model import precision
    from rlvr.backends.train import shared_prefix

    if not split:  # a model with no plain body/head split is run whole, in both passes
        monkeypatch.setattr(precision, "split_head", lambda model: None)
    batch = _train_batch(policy, k=3)
    assert len(set(batch["prompt_lens"])) > 1  # prompts of different lengths share one padded prefix
    logp, entropy, grads = _logp_and_grads(policy, batch)
    calls = []
    real = shared_prefix.shared_prompt_logprobs
    monkeypatch.setattr("rlvr.backends.train.trainer.shared_prompt_logprobs",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    s_logp, s_entropy, s_grads = _logp_and_grads(policy, batch, share_prompts=True)
    assert calls  # the shared layout ran (it did not fall back to the padded one)
    assert torch.allclose(logp, s_logp, atol=1e-5) and torch.allclose(entropy, s_entropy, atol=1e-5)
    assert (s_logp[batch["mask"] == 0] == 0).all()
    assert grads.keys() == s_grads.keys() and grads
    for name, g in grads.items():
        assert torch.allclose(g, s_grads[name], atol=1e-5, rtol=1e-4), name


def test_shared_prompts_fall_back_to_padded_rows_when_no_prompt_repeats(policy):
    from rlvr.backends.train.shared_prefix import shared_prompt_logprobs

    assert shared_prompt_logprobs(policy.model, _train_batch(policy, k=1), 0.7) is None
    assert shared_prompt_logprobs(policy.model, _train_batch(policy, k=2), 0.7) is not None


def test_bf16_autocast_keeps_log_probs_near_and_master_weights_float32(policy):
    batch = _train_batch(policy)
    logp, _, grads = _logp_and_grads(policy, batch)
    for layout in ({"packed": False}, {"packed": True}, {"share_prompts": True}):
        a_logp, _, a_grads = _logp_and_grads(policy, batch, autocast="bfloat16", **layout)
        assert (a_logp - logp).abs().max() < 0.05  # bf16 body, float32 head and log-softmax
        assert all(g.dtype == torch.float32 for g in a_grads.values()) and a_grads.keys() == grads.keys()
    assert all(p.dtype == torch.float32 for p in policy.model.parameters())


def test_train_settings_refuse_an_unknown_autocast():
    from rlvr.backends.train.trainer import TorchTrainer
    from rlvr.config.run import TrainSection
    from rlvr.errors import ConfigError

    with pytest.raises(ConfigError, match="TrainSection.autocast"):
        TrainSection(autocast="float16")
    with pytest.raises(ValueError, match="autocast must be one of"):
        TorchTrainer.__init__(object.__new__(TorchTrainer), None, autocast="fp8")


@pytest.mark.parametrize("share", [True, False])
def test_share_prompts_settings_reach_the_trainer_and_the_engine(policy, share):
    from pathlib import Path

    from rlvr.config.run import load_run_config
    from rlvr.wiring.sampler import rollout_engine
    from rlvr.wiring.trainer import make_trainer

    example = Path(__file__).resolve().parents[2] / "examples" / "addition.toml"
    cfg = load_run_config(str(example), [f"--train.share_prompts={str(share).lower()}",
                                         f"--sampler.share_prompts={str(share).lower()}"])
    assert make_trainer(cfg, policy).share_prompts is share
    engine, _ = rollout_engine(cfg, policy)
    try:
        assert engine.share_prompts is share
    finally:
        engine.close()
