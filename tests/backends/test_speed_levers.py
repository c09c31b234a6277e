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
