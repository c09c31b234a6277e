"""Run by tests/e2e/test_vllm_colocate_runs.py under vLLM's interpreter: the colocated engine's
contract on a real vLLM, printed as one JSON line (``CHECK {...}``) for the test to assert on.

Usage: python tests/support/vllm_colocate_check.py WORK_DIR full|lora (one engine per process, as in a run).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import torch

from rlvr.backends.model.io import token_logprobs
from rlvr.backends.model.policy import LoraSpec, Policy
from rlvr.backends.model.tiny import build_tiny_model
from rlvr.backends.sample.vllm_engine import ColocatedVLLM
from rlvr.backends.sample.vllm_setup import engine_kwargs, start_llm, user_engine_args
from rlvr.backends.sync.colocate import ColocateLane
from rlvr.errors import BackendError, ConfigError
from rlvr.types import SamplingParams


def own_logprobs(policy: Policy, prompt: list[int], ids: tuple[int, ...], temperature: float) -> list[float]:
    full = torch.tensor([prompt + list(ids)])
    with torch.no_grad():
        out = token_logprobs(policy.model.eval(), full, torch.ones_like(full), temperature=temperature)
    return out[0, len(prompt) - 1:].tolist()


def gap(a, b) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


async def sampling(engine: ColocatedVLLM, policy: Policy, prompt: list[int]) -> dict:
    tempered = SamplingParams(max_tokens=8, temperature=0.7)
    alone = await engine.generate(prompt, tempered, seed=5)
    crowd = await asyncio.gather(*[engine.generate(prompt if i % 2 else prompt[:-1], tempered, seed=5 if i == 3 else i)
                                   for i in range(6)])
    greedy = await engine.generate(prompt, SamplingParams(max_tokens=8, temperature=0.0), seed=1)
    scored = await engine.score(prompt, alone.ids)
    allowed = await engine.generate(prompt, SamplingParams(max_tokens=6, allowed_token_ids=(20, 21, 22)), seed=3)
    banned = await engine.generate(prompt, SamplingParams(max_tokens=6, temperature=0.0,
                                                          bad_words_ids=((greedy.ids[0],),)), seed=1)
    stopped = await engine.generate(prompt, SamplingParams(max_tokens=8, temperature=0.7,
                                                           stop_token_ids=(alone.ids[2],)), seed=5)
    return {
        "same_seed_same_completion": alone.ids == crowd[3].ids and alone.logprobs == crowd[3].logprobs,
        "tempered_gap": gap(alone.logprobs, own_logprobs(policy, prompt, alone.ids, 0.7)),
        "greedy_gap": gap(greedy.logprobs, own_logprobs(policy, prompt, greedy.ids, 0.0)),
        "score_gap": gap(scored, own_logprobs(policy, prompt, alone.ids, 1.0)),
        "allowed_only": set(allowed.ids) <= {20, 21, 22},
        "banned_avoided": greedy.ids[0] not in banned.ids,
        "stop_kept": [list(stopped.ids), alone.ids[2], str(stopped.stop_reason)],
        "version": alone.version,
    }


def pushed_gaps(policy: Policy, lane: ColocateLane) -> list[float]:
    """Publish twice after moving the trainable weights; the lane's probe gap after each."""
    gaps = []
    for version in (1, 2):
        with torch.no_grad():
            for p in policy.model.parameters():
                if p.requires_grad:
                    p.add_(torch.randn_like(p) * 0.05)
        policy.version = version
        lane(version)
        gaps.append(lane.probe_gaps[-1])
    return gaps


def refusals() -> dict:
    out = {"parsed": user_engine_args(["--max-num-seqs=64", "--enforce-eager"])}
    try:
        user_engine_args(["--logprobs-mode", "raw_logprobs"])
    except ConfigError as exc:
        out["owned"] = str(exc)
    return out


def main(work: Path, mode: str) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(2)
    base = build_tiny_model(work / "tiny", hidden=64, layers=2, heads=2)
    lora = 4 if mode == "lora" else 0
    policy = Policy(str(base), lora=LoraSpec(rank=lora, alpha=8.0) if lora else None, need_reference=False)
    llm = start_llm(engine_kwargs(str(base), dtype="float32", seed=0, device="cpu", vllm_args=["--enforce-eager"]))
    engine = ColocatedVLLM(llm, eos_ids=policy.eos_ids, max_model_len=llm.llm_engine.model_config.max_model_len)
    lane = ColocateLane(engine, policy)
    result: dict = {"threads_kept": torch.get_num_threads() == 2}
    try:
        lane(0)
        prompt = [int(t) for t in policy.tokenizer("12+34=")["input_ids"]]
        if not lora:
            result |= asyncio.run(sampling(engine, policy, prompt)) | {"refusals": refusals()}
        result["push_gaps"] = pushed_gaps(policy, lane)
        try:
            engine.generate_now(list(range(3)) * 1000, SamplingParams(max_tokens=4), seed=0)
        except BackendError as exc:
            result["too_long"] = str(exc)
    finally:
        lane.close()
    print("CHECK " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
