"""Turn matching: the model calls of one black-box agent episode, stitched into training segments.

An agent that rlvr cannot rewrite (its own loop, its own prompts, sub-agents, context compaction)
calls the model through the recording proxy, which keeps, per call, exactly what the generator was
given and answered: the prompt ids, the completion ids and their behaviour log-probs, the policy
version and the messages of the request. :func:`match_turns` turns those calls, in arrival order,
into the segments the trainer learns from. Each call is one of:

- **APPEND**: its prompt starts, token for token, with an open segment's whole sequence (that
  segment's prompt, plus everything appended to it, plus its last completion). The tokens between
  (what the agent, its tools or the chat template inserted: tool results, a user turn, the role
  markers) join the segment with loss mask 0 and log-prob 0; the completion joins with mask 1 and
  its behaviour log-probs. When several segments qualify, the longest match wins.
- **NEW**: the first call, or a call whose conversation shares its beginning with a segment but
  whose tokens do not extend it: the agent edited or truncated its history, branched from an earlier
  point (sampled again from the same messages), or the chat template rendered earlier turns
  differently (a template that drops past reasoning, a reply re-tokenized another way). It starts a
  segment of its own, with its whole prompt as the prompt.
- **WIPE**: a call sharing no message with any segment: the agent restarted its context or a
  sub-agent with its own history started. It starts a segment of its own too; the earlier segments
  stay whole and may still be appended to (a main agent resuming after its sub-agent).

Invariants: a segment's tokens are exactly the tokens each of its calls was conditioned on and
produced (prompts are never re-rendered here, masks never shifted over a mismatch); mask 1 falls
on generated tokens only, and log-probs are 0 wherever the mask is; every call lands in exactly one
segment. The messages decide only the label of a call that does not append (tokens decide
appending), so an agent that re-serialises its messages (``content: null``, reordered keys, tool
call ids) never breaks a segment whose tokens match. Standard library only.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from rlvr.types import Message, StopReason


class TurnKind(StrEnum):
    """How a call relates to the episode so far (see the module docstring)."""

    NEW = "new"
    APPEND = "append"
    WIPE = "wipe"


@dataclass(frozen=True, slots=True)
class Call:
    """One model call as the proxy recorded it: exactly what the generator was given and answered."""

    index: int  # its place in the episode's arrival order
    prompt_ids: tuple[int, ...]  # what the generator was given
    completion_ids: tuple[int, ...]  # what it answered (the part the reply is made of)
    logprobs: tuple[float, ...]  # behaviour log-prob of each completion token
    messages: tuple[Message, ...] | None = None  # the request's conversation; None for a text prompt
    reply: Message | None = None  # the assistant message answered (content, tool_calls)
    version: int | None = None  # the policy version that produced it
    stop_reason: StopReason = StopReason.STOP
    server: str | None = None  # the server that answered, when the generator can tell

    def __post_init__(self) -> None:
        if len(self.logprobs) != len(self.completion_ids):
            raise ValueError(f"call {self.index}: {len(self.completion_ids)} completion ids but "
                             f"{len(self.logprobs)} log-probs; they must align token by token")
        if not self.prompt_ids:
            raise ValueError(f"call {self.index}: empty prompt")


@dataclass(frozen=True, slots=True)
class Turn:
    """The verdict on one call: its kind, the segment it went to, and why."""

    call: int  # Call.index
    kind: TurnKind
    segment: int  # index into the segments returned with it
    reason: str


@dataclass(frozen=True, slots=True)
class Segment:
    """One training sequence: ``prompt_ids`` then ``completion_ids``, with ``loss_mask`` and
    ``logprobs`` aligned with the completion (1 and the behaviour log-prob on generated tokens, 0
    and 0 on inserted ones)."""

    calls: tuple[int, ...]  # Call.index of each call stitched into it, in order
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    loss_mask: tuple[int, ...]
    versions: tuple[int, ...]  # of the calls that carried one
    stop_reason: StopReason  # of its last call
    messages: tuple[Message, ...]  # its last call's conversation and reply ((), for text prompts)

    @property
    def version(self) -> int | None:
        """The oldest policy that wrote any of it: staleness is judged by the worst token."""
        return min(self.versions) if self.versions else None

    @property
    def generated(self) -> int:
        return sum(self.loss_mask)


@dataclass(slots=True)
class _Open:
    calls: list[int]
    prompt: tuple[int, ...]
    completion: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    stop: StopReason = StopReason.STOP
    keys: tuple[str, ...] = ()  # message keys of its last call's conversation and reply
    messages: tuple[Message, ...] = ()

    @property
    def length(self) -> int:
        return len(self.prompt) + len(self.completion)

    @property
    def tokens(self) -> tuple[int, ...]:
        return (*self.prompt, *self.completion)

    def extended_by(self, prompt: tuple[int, ...]) -> bool:
        n = len(self.prompt)
        return (len(prompt) >= self.length and prompt[:n] == self.prompt
                and list(prompt[n:self.length]) == self.completion)

    def add(self, call: Call, inserted: Sequence[int]) -> None:
        self.calls.append(call.index)
        self.completion += [*inserted, *call.completion_ids]
        self.logprobs += [0.0] * len(inserted) + list(call.logprobs)
        self.mask += [0] * len(inserted) + [1] * len(call.completion_ids)
        if call.version is not None:
            self.versions.append(call.version)
        self.stop = call.stop_reason
        self.keys = conversation_keys(call)
        self.messages = (*call.messages, *([call.reply] if call.reply else [])) if call.messages is not None else ()

    def freeze(self) -> Segment:
        return Segment(tuple(self.calls), self.prompt, tuple(self.completion), tuple(self.logprobs),
                       tuple(self.mask), tuple(self.versions), self.stop, self.messages)


def match_turns(calls: Sequence[Call]) -> tuple[list[Turn], list[Segment]]:
    """The verdict on every call (in arrival order) and the segments they make (in the order they
    were opened). See the module docstring for the rules."""
    ordered = sorted(calls, key=lambda c: c.index)
    if len({c.index for c in ordered}) != len(ordered):
        raise ValueError("match_turns: two calls share an index")
    open_: list[_Open] = []
    turns: list[Turn] = []
    for call in ordered:
        target = max((k for k, s in enumerate(open_) if s.extended_by(call.prompt_ids)),
                     key=lambda k: open_[k].length, default=None)
        if target is not None:
            segment = open_[target]
            inserted = call.prompt_ids[segment.length:]
            reason = (f"extends segment {target} token by token ({len(inserted)} inserted tokens, "
                      f"{len(call.completion_ids)} generated)")
            turns.append(Turn(call.index, TurnKind.APPEND, target, reason))
            segment.add(call, inserted)
            continue
        kind, reason = _fresh(call, open_)
        turns.append(Turn(call.index, kind, len(open_), reason))
        segment = _Open(calls=[], prompt=call.prompt_ids)
        segment.add(call, ())
        open_.append(segment)
    return turns, [s.freeze() for s in open_]


def _fresh(call: Call, open_: Sequence[_Open]) -> tuple[TurnKind, str]:
    """Why a call that appends to nothing starts a segment: NEW or WIPE, with the reason."""
    if not open_:
        return TurnKind.NEW, "the episode's first call"
    keys = message_keys(call.messages) if call.messages is not None else ()
    if call.messages is None or not keys:  # a text prompt: tokens are all there is to compare
        shared = max(_common(call.prompt_ids, s.tokens) for s in open_)
        if shared <= 1:  # a shared begin-of-sequence token is not a shared history
            return TurnKind.WIPE, "its text prompt shares nothing with the episode's segments"
        return TurnKind.NEW, f"its text prompt shares {shared} tokens with a segment, then differs"
    best = max(range(len(open_)), key=lambda k: _common(keys, open_[k].keys))
    shared = _common(keys, open_[best].keys)
    if shared == 0:
        return TurnKind.WIPE, "shares no message with the episode's segments (context restarted, or a sub-agent)"
    if shared == len(open_[best].keys):
        return TurnKind.NEW, (f"its messages extend segment {best}'s conversation but its tokens do not: the chat "
                              "template rendered earlier turns differently (or re-tokenized a reply)")
    if shared == len(keys):
        return TurnKind.NEW, (f"branches from segment {best}: its conversation is the first {shared} of that segment's "
                              f"{len(open_[best].keys)} messages (a new sample from an earlier point)")
    return TurnKind.NEW, (f"history edited or truncated: shares the first {shared} of segment {best}'s "
                          f"{len(open_[best].keys)} messages, then differs")


def _common(a: Sequence[Any], b: Sequence[Any]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


# ---- message keys: what counts as "the same message" when labelling a call ---------------------
def conversation_keys(call: Call) -> tuple[str, ...]:
    """The keys of a call's conversation followed by its reply."""
    if call.messages is None:
        return ()
    return message_keys([*call.messages, *([call.reply] if call.reply else [])])


def message_keys(messages: Sequence[Message]) -> tuple[str, ...]:
    """One short hash per message of what a model reads in it: its role, its text (stripped) and its
    tool calls' names and parsed arguments. Ids, ``null`` versus ``""`` content and key order are
    left out: agents re-serialise them freely."""
    return tuple(hashlib.blake2b(json.dumps(_essence(m), sort_keys=True).encode(), digest_size=8).hexdigest()
                 for m in messages)


def _essence(message: Message) -> dict[str, Any]:
    content = message.get("content")
    if isinstance(content, list):  # content parts: their text, in order
        content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    calls = []
    for c in message.get("tool_calls") or ():
        function = c.get("function", {}) if isinstance(c, dict) else {}
        args = function.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                pass  # kept as text: compared as written
        calls.append([function.get("name"), args])
    return {"role": message.get("role"), "content": str(content or "").strip(), "tool_calls": calls}
