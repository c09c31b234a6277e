"""Anthropic's Messages shape (``POST /v1/messages``, not streamed) over the same recorded sampling.

A request is translated into the OpenAI chat shape the run's chat template reads (system text as a
system message, ``tool_use`` blocks as tool calls, ``tool_result`` blocks as tool messages, tools'
``input_schema`` as function parameters), sampled and recorded exactly as a chat completion, and
answered as Anthropic's message (text and ``tool_use`` blocks, ``stop_reason``, ``usage``). Every field
is honoured or refused by name (``tool_choice`` ``any`` and ``tool`` as the OpenAI shape's
``"required"`` and named function: prefilled); ``stream=true`` is refused (use ``/v1/chat/completions`` to stream).

A backend module: imports pydantic and works on the tokenizer it is handed.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rlvr.backends.proxy.openai_api import Model, render_chat, sample
from rlvr.backends.proxy.sessions import Attempt, SessionBook
from rlvr.backends.serve.requests import ChatBody, parse
from rlvr.errors import RequestError
from rlvr.types import Message


class MessagesBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    max_tokens: int = Field(ge=1)
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    stream: bool = False
    metadata: dict[str, Any] | None = None  # the caller's own tags: recorded nowhere, changes nothing


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(b, dict) and b.get("type") == "text" for b in content):
        return "".join(str(b.get("text", "")) for b in content)
    raise RequestError(f"{where}: only text content is supported here", "messages")


def openai_messages(body: MessagesBody) -> list[Message]:
    """The request as OpenAI chat messages."""
    out: list[Message] = [{"role": "system", "content": _text(body.system, "system")}] if body.system else []
    for i, m in enumerate(body.messages):
        role, content = m.get("role"), m.get("content")
        if role not in ("user", "assistant"):
            raise RequestError(f"messages[{i}].role must be 'user' or 'assistant'", "messages")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list) or not all(isinstance(b, dict) for b in blocks):
            raise RequestError(f"messages[{i}].content must be text or a list of blocks", "messages")
        text = "".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")
        calls = [{"id": b.get("id"), "type": "function", "function": {"name": b.get("name"),
                                                                    "arguments": b.get("input") or {}}}
                 for b in blocks if b.get("type") == "tool_use"]
        results = [{"role": "tool", "tool_call_id": b.get("tool_use_id"),
                    "content": _text(b.get("content", ""), f"messages[{i}] tool_result")}
                   for b in blocks if b.get("type") == "tool_result"]
        unknown = sorted({str(b.get("type")) for b in blocks} - {"text", "tool_use", "tool_result"})
        if unknown:
            raise RequestError(f"messages[{i}]: content blocks of type {unknown} are not supported", "messages")
        out += results
        if text or calls or not results:
            out.append({"role": role, "content": text, **({"tool_calls": calls} if calls else {})})
    return out


def _chat_body(body: MessagesBody) -> ChatBody:
    if body.stream:
        raise RequestError("stream=true is not answered in the Messages shape by the rlvr proxy; use "
                           "/v1/chat/completions to stream", "stream")
    choice = body.tool_choice or {"type": "auto"}
    kind = choice.get("type")
    if kind not in ("auto", "any", "tool", "none"):
        raise RequestError(f"tool_choice type {kind!r} is not one of auto, any, tool, none", "tool_choice")
    tool_choice: Any = {"auto": "auto", "any": "required", "none": "none"}.get(str(kind)) or \
        {"type": "function", "function": {"name": choice.get("name")}}
    tools = [{"type": "function", "function": {"name": t.get("name"), "description": t.get("description", ""),
                                               "parameters": t.get("input_schema", {})}} for t in body.tools or []]
    return parse(ChatBody, {"model": body.model, "messages": openai_messages(body), "max_tokens": body.max_tokens,
                            "temperature": body.temperature, "top_p": body.top_p, "stop": body.stop_sequences,
                            "tools": tools or None, "tool_choice": tool_choice if tools else None})


async def messages(book: SessionBook, model: Model, body: MessagesBody, sid: str | None,
                   attempt: Attempt | None = None) -> dict[str, Any]:
    chat_body = _chat_body(body)
    session = book.get(sid)
    if attempt is not None:
        book.begin(session, attempt)
    rendered = await render_chat(model, chat_body)
    prompt = rendered.prompt
    [done] = await sample(book, session, model, prompt, chat_body, body.max_tokens, chat_body.messages,
                          rendered.parse_tools, attempt=attempt, parser=rendered.parser, prefill=rendered.prefill)
    choice = done.choice
    content: list[dict[str, Any]] = [{"type": "text", "text": choice.content}] if choice.content else []
    for call in choice.tool_calls:
        function = call["function"]
        content.append({"type": "tool_use", "id": call["id"], "name": function["name"],
                        "input": json.loads(function["arguments"])})
    stop = {"tool_calls": "tool_use", "length": "max_tokens"}.get(choice.finish_reason)
    stop = stop or ("stop_sequence" if isinstance(choice.stop_reason, str) else "end_turn")
    return {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant", "model": body.model,
            "content": content, "stop_reason": stop,
            "stop_sequence": choice.stop_reason if stop == "stop_sequence" else None,
            "usage": {"input_tokens": len(prompt), "output_tokens": len(choice.ids)},
            "rlvr_policy_version": done.call.version}
