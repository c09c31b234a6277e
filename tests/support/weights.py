"""Helpers for tests that move a real (tiny) model's weights: a stand-in optimizer step and the
greedy completion the policy itself gives, to compare with what a server serves. Needs torch."""

from __future__ import annotations

import torch

from rlvr.backends.sample.batched import sample_batch
from rlvr.types import SamplingParams

GREEDY = SamplingParams(max_tokens=8, temperature=0.0)
PROMPT = [9, 10, 80, 11]


def train_step(policy, seed: int) -> None:
    """Stand-in for an optimizer step: move every trainable weight, bump the version."""
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for p in policy.trainable_parameters():
            p.add_(torch.randn_like(p) * 0.3)
    policy.version += 1


def local_greedy(policy) -> tuple[int, ...]:
    """The greedy completion of ``PROMPT`` under the policy's own, live weights."""
    return sample_batch(policy.model, [PROMPT], GREEDY, seed=0, eos_ids=policy.eos_ids,
                        pad_id=policy.tokenizer.pad_token_id)[0].ids


def hand_rollouts(tokenizer, replies: dict[str, tuple[str, ...]]) -> list:
    """Each prompt's given replies as rollouts, each ended by the end token (no sampler involved: for
    tests of the trainer). Behaviour log-probs are 0."""
    from rlvr.types import Rollout

    out = []
    for prompt, answers in replies.items():
        prompt_ids = tuple(tokenizer(prompt)["input_ids"])
        for reply in answers:
            ids = tuple(tokenizer(reply, add_special_tokens=False)["input_ids"]) + (tokenizer.eos_token_id,)
            out.append(Rollout(prompt, prompt_ids, ids, (0.0,) * len(ids), reply,
                               ({"role": "user", "content": prompt}, {"role": "assistant", "content": reply})))
    return out
