"""Multi-turn rollouts: strictly extending token ids, loss masks on generated tokens only, segments."""

from __future__ import annotations

import asyncio
import dataclasses
import re

import pytest

from rlvr import RLLoop
from rlvr.data.tasks import load_tasks
from rlvr.errors import DataError
from rlvr.protocols import RolloutSetup
from rlvr.rollouts.episodes import multi_turn, single_turn
from rlvr.testing import FakeChatTokenizer, FakeGenerator, FakeTrainer, ScriptedEvaluator, make_rows
from rlvr.types import RolloutRequest, SamplingParams

TOK = FakeChatTokenizer()


class Retry:
    """Asks again (as the user) while the last answer is wrong."""

    def reward_fn(self, messages, answer):
        return 1.0 if messages[-1]["content"] == answer else 0.0

    def interact(self, messages, state):
        if messages[-1]["content"] == state["answer"]:
            return []
        return [{"role": "user", "content": f"again ({state['turn']})"}]


def wrong_then_right(answer: str, wrong: int = 1):
    def respond(prompt: str, seed: int) -> str:
        return answer if prompt.count("again") >= wrong else "no"

    return respond


def request(task, index=0):
    return RolloutRequest(task, index, version=0, seed=7)


def rollout_of(respond, *, env=None, max_turns=4, tokenizer=TOK):
    task = load_tasks([{"prompt": "2+3=", "answer": "5"}])[0]
    gen = FakeGenerator(respond, tokenizer=tokenizer)
    fn = multi_turn(RolloutSetup(gen, tokenizer, SamplingParams(), env=env or Retry()), max_turns=max_turns)
    return task, gen, asyncio.run(fn(request(task)))


def test_masks_cover_exactly_the_generated_tokens_token_by_token():
    task, gen, r = rollout_of(wrong_then_right("5", wrong=2))
    assert [m["content"] for m in r.messages] == ["2+3=", "no", "again (1)", "no", "again (2)", "5"]
    # Rebuild the expected sequence piece by piece: generated turns and what the env added.
    E, A, U = TOK.EOS, TOK.ROLES["assistant"], TOK.ROLES["user"]
    pieces = [(list(b"no") + [E], 1), ([U, *b"again (1)", E, A], 0), (list(b"no") + [E], 1),
              ([U, *b"again (2)", E, A], 0), (list(b"5") + [E], 1)]
    assert list(r.completion_ids) == [t for ids, _ in pieces for t in ids]
    assert list(r.loss_mask) == [m for ids, m in pieces for _ in ids]
    assert all((lp == 0.0) == (m == 0) for lp, m in zip(r.logprobs, r.loss_mask, strict=True))
    # Ids only ever extend: each generation's prompt is the previous prompt plus what followed it.
    assert list(r.prompt_ids) == TOK.render(task.messages)
    for before, after in zip(gen.calls, gen.calls[1:], strict=False):
        assert after[: len(before)] == before
    assert list(r.prompt_ids) + list(r.completion_ids) == list(gen.calls[-1]) + list(b"5") + [E]


def test_the_episode_ends_when_interact_returns_nothing_or_turns_run_out():
    _, gen, r = rollout_of(wrong_then_right("5", wrong=0))
    assert len(gen.calls) == 1 and set(r.loss_mask) == {1}
    _, gen, r = rollout_of(lambda p, s: "no", max_turns=3)
    assert len(gen.calls) == 3 and r.messages[-1] == {"role": "assistant", "content": "no"}


def test_a_template_that_rewrites_the_past_splits_the_episode_into_segments():
    task, gen, out = rollout_of(wrong_then_right("5"), tokenizer=FakeChatTokenizer(rewrite=True))
    assert isinstance(out, list) and len(out) == 2
    first, second = out
    assert first.prompt_ids == gen.calls[0] and list(first.completion_ids) == [*b"no", TOK.EOS]
    assert list(second.prompt_ids) == list(gen.calls[1])  # the re-rendered conversation
    assert list(second.completion_ids) == [*b"5", TOK.EOS]
    assert set(first.loss_mask) == set(second.loss_mask) == {1}  # nothing shifted, nothing masked


def test_segments_share_the_episode_reward_and_advantage_in_training():
    tok = FakeChatTokenizer(rewrite=True)
    trainer = FakeTrainer()
    gen = FakeGenerator(lambda p, s: "5" if (s % 2 and "again" in p) else "no", policy=trainer, tokenizer=tok)
    env = Retry()
    cfg_loop = dict(group_k=2, tasks_per_step=2, max_steps=2, heldout_every=2, corpus_min=20, heldout_frac=0.25)
    from rlvr import GRPOConfig

    loop = RLLoop.from_reward(GRPOConfig(**cfg_loop), env, make_rows(40),
                              rollout_fn=multi_turn(RolloutSetup(gen, tok, env=env), max_turns=2), trainer=trainer,
                              heldout_eval=ScriptedEvaluator(lambda s: 0.0))
    loop.run()
    segments_per_episode = []
    for call in trainer.calls:
        by_episode: dict[tuple, list] = {}
        for r, a in zip(call.rollouts, call.advantages, strict=True):
            by_episode.setdefault((r.task_id, repr(r.messages)), []).append((r.reward, a))
        assert all(len(set(v)) == 1 for v in by_episode.values())  # one reward and advantage per episode
        segments_per_episode += [len(v) for v in by_episode.values()]
    assert set(segments_per_episode) == {1, 2}  # retried episodes were split, first-try ones were not


def test_token_in_rows_are_sent_as_given():
    task = load_tasks([{"prompt": "ignored", "answer": "5", "info": {"prompt_ids": [1, 2, 3]}}])[0]
    gen = FakeGenerator(lambda p, s: "5")
    r = asyncio.run(single_turn(RolloutSetup(gen, TOK))(request(task)))
    assert gen.calls == [(1, 2, 3)] and r.prompt_ids == (1, 2, 3)
    with pytest.raises(DataError, match="info.prompt_ids' must be a non-empty list of token ids"):
        load_tasks([{"prompt": "x", "answer": "5", "info": {"prompt_ids": ["a"]}}])  # refused at load
    bad = dataclasses.replace(task, info={"prompt_ids": ["a"]})  # a Task built by hand still fails clearly
    with pytest.raises(ValueError, match="info.prompt_ids must be a non-empty list of token ids"):
        asyncio.run(single_turn(RolloutSetup(gen, TOK))(request(bad)))


def test_multi_turn_needs_an_interacting_environment():
    with pytest.raises(ValueError, match="interact"):
        multi_turn(RolloutSetup(FakeGenerator(lambda p, s: ""), TOK, env=object()), max_turns=2)
    with pytest.raises(ValueError, match="max_turns"):
        multi_turn(RolloutSetup(FakeGenerator(lambda p, s: ""), TOK, env=Retry()), max_turns=0)


def test_an_environment_that_edits_its_inputs_cannot_change_the_row():
    class Vandal(Retry):
        def interact(self, messages, state):
            messages[0]["content"] = "vandalised"
            state["info"]["seen"] = True
            return super().interact(messages, state)

    task, _, _ = rollout_of(wrong_then_right("5"), env=Vandal())
    assert task.messages[0]["content"] == "2+3=" and "seen" not in task.info


def test_the_readme_environment_runs_in_the_loop(tmp_path):
    from pathlib import Path

    from rlvr import GRPOConfig, read_record
    from rlvr.envs import environment

    env = environment(str(Path(__file__).resolve().parents[2] / "examples" / "my_env.py"))
    assert env.multi_turn
    trainer = FakeTrainer()

    def respond(prompt, seed):  # unparsable first, right on the second try
        a, b = re.match(r"(\d+)\+(\d+)=", prompt).groups()
        return str(int(a) + int(b)) if "again" in prompt else "?"

    gen = FakeGenerator(respond, policy=trainer)
    cfg = GRPOConfig(group_k=2, tasks_per_step=2, max_steps=2, heldout_every=2, corpus_min=20, heldout_frac=0.25)
    rollout_fn = multi_turn(RolloutSetup(gen, TOK, env=env), max_turns=2)
    loop = RLLoop.from_reward(cfg, env, make_rows(40), rollout_fn=rollout_fn, trainer=trainer,
                              heldout_eval=ScriptedEvaluator(lambda s: 0.0), out_dir=tmp_path)
    loop.run()
    rollouts = [r for c in trainer.calls for r in c.rollouts]
    assert {r.metrics["parsed"] for r in rollouts} == {1.0}  # the second try always parses
    assert all(r.reward == 1.0 and r.messages[-2]["content"] == "again" for r in rollouts)
    record = read_record(tmp_path)
    assert record.finished is not None
    assert all(m["reward/parsed"] == 1.0 and m["reward/reward"] == 1.0 for m in record.metrics)
