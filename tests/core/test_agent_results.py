"""What an agent's result scores (pure, no proxy): each return shape's conversation, reward and metrics,
the episode's segments as rollouts in the order the stream reads them, refusals naming the row, and
the held-out evaluator reading an episode's own reward as training does."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from rlvr.errors import AgentError
from rlvr.rollouts.agents import row_of, to_rollouts
from rlvr.rollouts.turns import Call, match_turns
from rlvr.run.evaluation import RolloutEvaluator
from rlvr.types import Rollout, RolloutRequest, Task

TASK = Task("r1", ({"role": "system", "content": "be brief"}, {"role": "user", "content": "2+3="}), "5", "h",
            info={"level": 1})
REQUEST = RolloutRequest(TASK, 2, 4, 99)
QUESTION = ({"role": "user", "content": "2+3="},)


@dataclass
class Episode:
    calls: list
    turns: list
    segments: list


def episode(*calls: Call) -> Episode:
    turns, segments = match_turns(calls)
    return Episode(list(calls), turns, segments)


TWO_CONTEXTS = episode(
    Call(0, (1, 2), (3, 9), (-0.1, -0.2), messages=({"role": "user", "content": "plan"},),
         reply={"role": "assistant", "content": "ok"}, version=4),
    Call(1, (7, 8), (5, 9), (-0.3, -0.4), messages=QUESTION, reply={"role": "assistant", "content": "5"}, version=3))


def decode(ids):
    return "|".join(map(str, ids))


def test_the_row_an_agent_receives():
    row = row_of(REQUEST)
    assert row == {"id": "r1", "prompt": "2+3=", "messages": list(TASK.messages), "answer": "5",
                   "info": {"level": 1}, "sample": 2}


def test_a_string_is_the_final_answer_after_the_rows_prompt():
    out = to_rollouts(REQUEST, TWO_CONTEXTS, "5", decode)
    assert isinstance(out, list) and len(out) == 2
    first, last = out
    assert last.messages == (*TASK.messages, {"role": "assistant", "content": "5"})
    assert first.messages == ({"role": "user", "content": "plan"}, {"role": "assistant", "content": "ok"})
    assert (first.version, last.version) == (4, 3) and last.reward is None and first.text == "3|9"
    assert first.loss_mask == (1, 1) and last.logprobs == (-0.3, -0.4)


def test_none_scores_the_last_calls_conversation_and_a_list_is_taken_as_it_is():
    last = to_rollouts(REQUEST, TWO_CONTEXTS, None, decode)[-1]
    assert last.messages == (*QUESTION, {"role": "assistant", "content": "5"})
    given = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    assert to_rollouts(REQUEST, TWO_CONTEXTS, given, decode)[-1].messages == tuple(given)


def test_a_dict_gives_the_reward_and_metrics_to_the_last_segment_only():
    first, last = to_rollouts(REQUEST, TWO_CONTEXTS, {"answer": "5", "reward": 0.5, "metrics": {"tries": 2}}, decode)
    assert (last.reward, last.metrics) == (0.5, {"tries": 2.0}) and first.reward is None and first.metrics == {}


@pytest.mark.parametrize("result, message", [
    ({"answer": "5", "score": 1}, "keys \\['score'\\]"),
    ({"reward": float("nan")}, "reward=nan"),
    ({"reward": True}, "reward=True"),
    (3.5, "returned float"),
])
def test_malformed_results_are_refused_naming_the_row(result, message):
    with pytest.raises(AgentError, match=message) as info:
        to_rollouts(REQUEST, TWO_CONTEXTS, result, decode)
    assert "row 'r1' sample 2" in str(info.value)


def test_held_out_reads_an_episodes_own_reward():
    async def rollout(request):
        return Rollout(request.id, (1,), (2,), (-0.1,), "x", ({"role": "assistant", "content": "wrong"},), reward=0.75)

    never = lambda messages, answer: pytest.fail("the environment's reward is not asked when the episode scored itself")
    report = RolloutEvaluator(rollout, never)(3, [TASK])
    assert report.score == 0.75 and report.per_task == {"r1": 0.75}
