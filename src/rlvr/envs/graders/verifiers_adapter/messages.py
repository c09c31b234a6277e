"""Between rlvr's conversation (OpenAI-style dicts, the model's raw text) and verifiers' messages.

- **Rows**: an rlvr row's ``answer`` is verifiers' rollout input without its prompt, under one
  key: ``{"verifiers_input": {"answer": ..., "info": {...}, "example_id": i, <other columns>}}``.
  rlvr passes a reward function only ``(messages, answer)``, and verifiers' reward functions may
  read ``info`` and any dataset column, so the row carries them; :func:`unpack_answer` gives them
  back (a plain answer from another source is taken as ``{"answer": it}``).
- **Tool calls**: the model writes them in the Hermes format most tool-calling chat templates
  teach, ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``. :func:`to_vf_messages`
  parses them into verifiers' ``tool_calls`` (ids ``call_<message>_<n>``, the same on every
  parse) and leaves the text around them as the content; a block that is not valid JSON with a
  ``name`` is left in the text, as vLLM's parser leaves it. rlvr's own conversation keeps the raw
  text, so the token ids of past turns never change.
- **Replies**: :func:`to_rlvr_message` turns what ``env_response`` returns into a plain dict
  (``role``, text ``content``, ``tool_call_id`` for tool results).

Standard library only; the verifiers helpers are imported by the functions that need them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from rlvr.errors import ConfigError

PACKED = "verifiers_input"
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def pack_answer(row: Mapping[str, Any], info: Mapping[str, Any], index: int) -> dict[str, Any]:
    """The rlvr answer of a verifiers dataset row: its rollout input without the prompt."""
    rest = {k: v for k, v in row.items() if k not in ("prompt", "info", "example_id") and v is not None}
    example_id = row.get("example_id")
    return {PACKED: {**rest, "answer": "" if row.get("answer") is None else row["answer"], "info": dict(info),
                     "example_id": example_id if isinstance(example_id, int) else index}}


def unpack_answer(answer: Any) -> dict[str, Any]:
    """verifiers' rollout input (without ``prompt``) from an rlvr answer; see the module doc."""
    if isinstance(answer, Mapping) and set(answer) == {PACKED} and isinstance(answer[PACKED], Mapping):
        return dict(answer[PACKED])
    return {"answer": answer, "info": {}, "example_id": 0}


def gold_answer(answer: Any) -> Any:
    """The dataset's own ``answer`` column (what a warm start should teach) from an rlvr answer."""
    return unpack_answer(answer).get("answer", "")


def split_messages(messages: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """verifiers' ``(prompt, completion)``: the messages before the first assistant message and the rest."""
    first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), None)
    if first is None:
        raise ValueError("verifiers reward_fn: messages hold no assistant message; pass the conversation "
                         "including the model's reply")
    return [dict(m) for m in messages[:first]], [dict(m) for m in messages[first:]]


def parse_tool_calls(text: str, index: int) -> tuple[str | None, list[dict[str, str]]]:
    """``(content, tool_calls)`` of an assistant's text; see the module doc for the format."""
    calls: list[dict[str, str]] = []

    def take(match: re.Match[str]) -> str:
        try:
            data = json.loads(match.group(1))
        except (ValueError, RecursionError):
            return match.group(0)
        if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"]:
            return match.group(0)
        args = data.get("arguments", data.get("parameters", {}))
        calls.append({"id": f"call_{index}_{len(calls)}", "name": data["name"],
                      "arguments": args if isinstance(args, str) else json.dumps(args)})
        return ""

    content = _TOOL_CALL.sub(take, text).strip()
    return (content or None) if calls else text, calls


def to_vf_messages(messages: Sequence[Mapping[str, Any]], *, tools: bool, start: int = 0) -> list[Any]:
    """verifiers' typed messages for rlvr's dicts (``start``: the index of the first in the episode,
    so tool-call ids stay stable); assistant tool calls are parsed where the environment has tools."""
    from verifiers.utils.message_utils import normalize_messages

    raw = []
    for i, message in enumerate(messages, start=start):
        message = {k: v for k, v in message.items() if v is not None}
        if tools and message.get("role") == "assistant" and isinstance(message.get("content"), str) \
                and not message.get("tool_calls"):
            content, calls = parse_tool_calls(message["content"], i)
            if calls:
                message = {**message, "content": content, "tool_calls": calls}
        raw.append(message)
    return list(normalize_messages(raw, field_name="messages"))


def to_rlvr_message(message: Any, env_name: str) -> dict[str, Any]:
    """A plain dict for one message ``env_response`` returned (a verifiers message or a dict)."""
    data = message.model_dump(exclude_none=True) if hasattr(message, "model_dump") else dict(message)
    role = data.get("role")
    if not isinstance(role, str):
        raise ConfigError(f"verifiers environment {env_name}: env_response returned a message without a role: "
                          f"{str(data)[:200]}")
    out: dict[str, Any] = {"role": role, "content": content_text(data.get("content"))}
    if isinstance(data.get("tool_call_id"), str):
        out["tool_call_id"] = data["tool_call_id"]
    return out


def content_text(content: Any) -> str:
    """Text of a message content: a string, or the text parts of a list of content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        text = part.get("text") if isinstance(part, Mapping) else getattr(part, "text", None)
        if not isinstance(text, str):
            raise ConfigError(f"a verifiers message holds a non-text content part ({str(part)[:80]}); rlvr's "
                              "episodes carry text only")
        parts.append(text)
    return "".join(parts)


def tool_schemas(tool_defs: Sequence[Any] | None) -> list[dict[str, Any]] | None:
    """verifiers' tool definitions as the OpenAI function schemas chat templates render."""
    if not tool_defs:
        return None
    out = []
    for tool in tool_defs:
        data = tool.model_dump(exclude_none=True) if hasattr(tool, "model_dump") else dict(tool)
        function = {"name": data["name"], "description": data.get("description", ""),
                    "parameters": data.get("parameters", {"type": "object", "properties": {}})}
        out.append({"type": "function", "function": function})
    return out
