"""Turn matching on real ChatML renders (SmolLM2's BPE tokenizer and template, a ChatML template with
tools, and one that rewrites earlier turns): append, edit, truncate, restart, parallel tool calls,
sub-agents, a re-tokenized reply. Each case checks the segments' tokens, masks and log-probs against
the calls that made them, with the inserted spans decoded and compared with hand-written ChatML."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rlvr.rollouts.turns import Call, TurnKind, match_turns, message_keys
from rlvr.types import StopReason

pytest.importorskip("transformers")

from support.chatml import THINKING_TEMPLATE, TOOLS_TEMPLATE, render, smollm2_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def tok():
    return smollm2_tokenizer()


class Episode:
    """An agent's calls as the proxy records them: the prompt is the real rendering of the request's
    messages; the completion is what the model "generated" (``text`` tokenized, or given ``ids``)
    followed by <|im_end|>; log-probs are distinct per call and token, so misalignment shows."""

    def __init__(self, tok: Any, template: str | None = None, tools: list[dict[str, Any]] | None = None):
        self.tok, self.template, self.tools, self.calls = tok, template, tools, []
        self.im_end = tok.convert_tokens_to_ids("<|im_end|>")

    def call(self, messages: list[dict[str, Any]], text: str, *, ids: list[int] | None = None,
             reply: dict[str, Any] | None = None) -> Call:
        prompt = render(self.tok, messages, template=self.template, tools=self.tools)
        completion = tuple(ids if ids is not None else self.tok(text, add_special_tokens=False)["input_ids"])
        completion += (self.im_end,)
        n = len(self.calls)
        logprobs = tuple(-(n + 1) - j / 1000 for j in range(len(completion)))
        call = Call(n, prompt, completion, logprobs, messages=tuple(messages),
                    reply=reply or {"role": "assistant", "content": text}, version=n)
        self.calls.append(call)
        return call

    def text(self, ids: Any) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=False)


def masked(segment, keep: int) -> list[int]:
    return [t for t, m in zip(segment.completion_ids, segment.loss_mask, strict=True) if m == keep]


def check_aligned(segment, calls: list[Call]) -> None:
    """Mask-1 tokens are exactly the calls' completions in order, with their own log-probs; mask-0 have 0."""
    generated = [t for c in calls for t in c.completion_ids]
    assert masked(segment, 1) == generated
    assert [lp for lp, m in zip(segment.logprobs, segment.loss_mask, strict=True) if m] == \
        [lp for c in calls for lp in c.logprobs]
    assert all(lp == 0.0 for lp, m in zip(segment.logprobs, segment.loss_mask, strict=True) if not m)
    # The whole sequence is what the last call saw, plus what it produced.
    assert segment.prompt_ids + segment.completion_ids == calls[-1].prompt_ids + calls[-1].completion_ids


SYSTEM = {"role": "system", "content": "You are a careful calculator."}


def conversation(*turns: str) -> list[dict[str, Any]]:
    roles = ["user", "assistant"]
    return [SYSTEM] + [{"role": roles[i % 2], "content": t} for i, t in enumerate(turns)]


def test_a_follow_up_appends_with_the_user_turn_masked(tok):
    ep = Episode(tok)
    c0 = ep.call(conversation("2+3?"), "The answer is 5.")
    c1 = ep.call(conversation("2+3?", "The answer is 5.", "Are you sure?"), "Yes.")
    turns, segments = match_turns(ep.calls)
    assert [t.kind for t in turns] == [TurnKind.NEW, TurnKind.APPEND]
    assert len(segments) == 1
    s = segments[0]
    assert s.prompt_ids == c0.prompt_ids and s.calls == (0, 1)
    check_aligned(s, [c0, c1])
    assert ep.text(masked(s, 0)) == "\n<|im_start|>user\nAre you sure?<|im_end|>\n<|im_start|>assistant\n"
    assert ep.text(masked(s, 1)) == "The answer is 5.<|im_end|>Yes.<|im_end|>"
    assert s.loss_mask == (1,) * len(c0.completion_ids) + (0,) * 14 + (1,) * len(c1.completion_ids)
    assert s.versions == (0, 1) and s.version == 0
    assert s.messages[-1] == {"role": "assistant", "content": "Yes."}


def test_an_edited_history_starts_a_new_segment(tok):
    ep = Episode(tok)
    ep.call(conversation("2+3?"), "5")
    ep.call(conversation("2+3?", "5", "And 4+4?"), "8")
    c2 = ep.call(conversation("2+4?", "6", "And 4+4?"), "8")  # the first question rewritten
    turns, segments = match_turns(ep.calls)
    assert [t.kind for t in turns] == [TurnKind.NEW, TurnKind.APPEND, TurnKind.NEW]
    assert "edited or truncated" in turns[2].reason and "first 1 of" in turns[2].reason
    assert [s.calls for s in segments] == [(0, 1), (2,)]
    check_aligned(segments[0], ep.calls[:2])
    check_aligned(segments[1], [c2])
    assert segments[1].prompt_ids == c2.prompt_ids and segments[1].loss_mask == (1,) * len(c2.completion_ids)


def test_a_truncated_history_starts_a_new_segment(tok):
    ep = Episode(tok)
    ep.call(conversation("2+3?"), "5")
    ep.call(conversation("2+3?", "5", "4+4?"), "8")
    c2 = ep.call(conversation("2+3?", "9-1?"), "8")  # the middle turns dropped
    turns, segments = match_turns(ep.calls)
    assert [t.kind for t in turns] == [TurnKind.NEW, TurnKind.APPEND, TurnKind.NEW]
    assert "shares the first 2 of segment 0's 5 messages" in turns[2].reason
    check_aligned(segments[1], [c2])


def test_a_restarted_context_is_a_wipe_and_the_old_segment_stays_whole(tok):
    ep = Episode(tok)
    c0 = ep.call(conversation("2+3?"), "5")
    fresh = [{"role": "system", "content": "Summary: the user asked 2+3, answered 5."},
             {"role": "user", "content": "Continue."}]
    c1 = ep.call(fresh, "Done.")
    c2 = ep.call([*fresh, {"role": "assistant", "content": "Done."}, {"role": "user", "content": "Bye"}], "Bye!")
    turns, segments = match_turns(ep.calls)
    assert [t.kind for t in turns] == [TurnKind.NEW, TurnKind.WIPE, TurnKind.APPEND]
    assert [t.segment for t in turns] == [0, 1, 1]
    check_aligned(segments[0], [c0])
    check_aligned(segments[1], [c1, c2])


TOOLS = [{"type": "function", "function": {"name": "add", "description": "a + b", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}]


def tool_calls(*args: dict[str, int]) -> list[dict[str, Any]]:
    """The OpenAI shape an agent sends back: JSON-string arguments, ids."""
    return [{"id": f"call_{i}", "type": "function", "function": {"name": "add", "arguments": json.dumps(a)}}
            for i, a in enumerate(args)]


def test_parallel_tool_calls_append_with_both_results_masked(tok):
    ep = Episode(tok, TOOLS_TEMPLATE, TOOLS)
    question = [{"role": "user", "content": "What are 2+3 and 1+1?"}]
    generated = ('<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>\n'
                 '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 1}}\n</tool_call>')
    reply = {"role": "assistant", "content": None, "tool_calls": tool_calls({"a": 2, "b": 3}, {"a": 1, "b": 1})}
    c0 = ep.call(question, generated, reply=reply)
    results = [{"role": "tool", "tool_call_id": "call_0", "content": "5"},
               {"role": "tool", "tool_call_id": "call_1", "content": "2"}]
    c1 = ep.call([*question, reply, *results], "5 and 2.")
    turns, segments = match_turns(ep.calls)
    assert [t.kind for t in turns] == [TurnKind.NEW, TurnKind.APPEND]
    check_aligned(segments[0], [c0, c1])
    assert ep.text(masked(segments[0], 0)) == ("\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>tool\n2<|im_end|>\n"
                                              "<|im_start|>assistant\n")
    assert "<tools>" in ep.text(segments[0].prompt_ids)


def test_tool_calls_the_template_writes_differently_split_instead_of_shifting(tok):
    ep = Episode(tok, TOOLS_TEMPLATE, TOOLS)
    question = [{"role": "user", "content": "2+3?"}]
    generated = '<tool_call>\n{"name":"add","arguments":{"a":2,"b":3}}\n</tool_call>'  # compact JSON
    reply = {"role": "assistant", "content": None, "tool_calls": tool_calls({"a": 2, "b": 3})}
    c0 = ep.call(question, generated, reply=reply)
    c1 = ep.call([*question, reply, {"role": "tool", "tool_call_id": "call_0", "content": "5"}], "5")
    turns, segments = match_turns(ep.calls)
    assert [t.kind for t in turns] == [TurnKind.NEW, TurnKind.NEW]
    assert "rendered earlier turns differently" in turns[1].reason
    check_aligned(segments[0], [c0])
    check_aligned(segments[1], [c1])
    assert segments[1].loss_mask == (1,) * len(c1.completion_ids)


def test_sub_agents_are_separate_segments_and_the_main_agent_resumes_its_own(tok):
    ep = Episode(tok)
    main = [SYSTEM, {"role": "user", "content": "Plan a sum, delegate the arithmetic."}]
    m0 = ep.call(main, "Delegating 2+3.")
    sub = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "2+3"}]
    s0 = ep.call(sub, "Let me think.")
    s1 = ep.call([*sub, {"role": "assistant", "content": "Let me think."},
                  {"role": "user", "content": "Answer only."}], "5")
    m1 = ep.call([*main, {"role": "assistant", "content": "Delegating 2+3."},
                  {"role": "user", "content": "The sub-agent says 5."}], "The sum is 5.")
    turns, segments = match_turns(ep.calls)
    assert [(t.kind, t.segment) for t in turns] == [(TurnKind.NEW, 0), (TurnKind.WIPE, 1), (TurnKind.APPEND, 1),
                                                    (TurnKind.APPEND, 0)]
    assert [s.calls for s in segments] == [(0, 3), (1, 2)]
    check_aligned(segments[0], [m0, m1])
    check_aligned(segments[1], [s0, s1])


def test_a_template_that_drops_earlier_reasoning_splits_at_the_new_user_turn(tok):
    ep = Episode(tok, THINKING_TEMPLATE)
    question = [{"role": "user", "content": "2+3?"}]
    thought = "<think>\nadd them\n</think>\nUse the tool."
    c0 = ep.call(question, thought)
    # A tool turn keeps the reasoning (no newer user message): the tokens extend.
    after_tool = [*question, {"role": "assistant", "content": thought}, {"role": "tool", "content": "5"}]
    c1 = ep.call(after_tool, "5")
    # A new user message: the template now renders the first reply without its reasoning.
    c2 = ep.call([*after_tool, {"role": "assistant", "content": "5"}, {"role": "user", "content": "Sure?"}], "Yes")
    turns, segments = match_turns(ep.calls)
    assert [t.kind for t in turns] == [TurnKind.NEW, TurnKind.APPEND, TurnKind.NEW]
    assert "rendered earlier turns differently" in turns[2].reason
    check_aligned(segments[0], [c0, c1])
    check_aligned(segments[1], [c2])
    assert "<think>" not in ep.text(segments[1].prompt_ids) and "<think>" in ep.text(masked(segments[0], 1))


def test_a_reply_sampled_as_other_tokens_than_the_template_gives_is_not_stitched(tok):
    ep = Episode(tok)
    canonical = tok("Hello there", add_special_tokens=False)["input_ids"]
    odd = tok("Hello", add_special_tokens=False)["input_ids"] + tok.convert_tokens_to_ids(["Ġ", "there"])
    assert odd != canonical and tok.decode(odd) == tok.decode(canonical)  # same text, other tokens
    c0 = ep.call(conversation("Greet me."), "Hello there", ids=odd)
    c1 = ep.call(conversation("Greet me.", "Hello there", "Again."), "Hi")
    turns, segments = match_turns(ep.calls)
    assert [t.kind for t in turns] == [TurnKind.NEW, TurnKind.NEW]
    check_aligned(segments[0], [c0])
    check_aligned(segments[1], [c1])


# ---- pure cases ------------------------------------------------------------------------------------
def call(index: int, prompt: tuple[int, ...], completion: tuple[int, ...], **kw: Any) -> Call:
    return Call(index, prompt, completion, tuple(-0.5 for _ in completion), **kw)


def test_the_longest_matching_segment_wins_and_a_branch_gets_its_own():
    calls = [call(0, (1, 2), (3,)), call(1, (1, 2, 3, 4), (5,)), call(2, (1, 2, 3, 4, 5, 6), (7,)),
             call(3, (1, 2, 3, 4), (9,))]  # call 3 branches from after call 0 again: nothing ends where it starts
    turns, segments = match_turns(calls)
    assert [t.kind for t in turns[:3]] == [TurnKind.APPEND if i else TurnKind.NEW for i in range(3)]
    assert turns[3].kind == TurnKind.NEW and "shares 4 tokens" in turns[3].reason
    assert segments[0].completion_ids == (3, 4, 5, 6, 7) and segments[0].loss_mask == (1, 0, 1, 0, 1)
    assert segments[1].prompt_ids == (1, 2, 3, 4) and segments[1].completion_ids == (9,)


def test_misaligned_calls_are_refused():
    with pytest.raises(ValueError, match="2 completion ids but 1 log-probs"):
        Call(0, (1,), (2, 3), (-1.0,))
    with pytest.raises(ValueError, match="share an index"):
        match_turns([call(0, (1,), (2,)), call(0, (1,), (3,))])


def test_message_keys_ignore_how_an_agent_re_serialises_a_message():
    recorded = {"role": "assistant", "content": None,
                "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 1}}}]}
    sent_back = {"content": "", "role": "assistant", "refusal": None,
                 "tool_calls": [{"id": "x", "type": "function", "function": {"arguments": '{"a": 1}', "name": "add"}}]}
    assert message_keys([recorded]) == message_keys([sent_back])
    assert message_keys([{"role": "user", "content": "a"}]) != message_keys([{"role": "user", "content": "b"}])


def test_a_segment_reports_its_last_stop_and_oldest_version():
    calls = [call(0, (1,), (2,), version=4), call(1, (1, 2, 3), (4,), version=3, stop_reason=StopReason.LENGTH)]
    _, [segment] = match_turns(calls)
    assert segment.version == 3 and segment.stop_reason == StopReason.LENGTH and segment.generated == 2


def test_sampling_again_from_the_same_messages_is_a_branch(tok):
    ep = Episode(tok)
    question = conversation("2+3?")
    c0 = ep.call(question, "5")
    c1 = ep.call(question, "6")  # an agent voting over two samples of one question
    turns, segments = match_turns(ep.calls)
    assert [t.kind for t in turns] == [TurnKind.NEW, TurnKind.NEW] and "branches from segment 0" in turns[1].reason
    check_aligned(segments[0], [c0])
    check_aligned(segments[1], [c1])
