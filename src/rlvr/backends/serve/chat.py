"""Chat requests to prompt ids, through the model's chat template (or the request's), and tool
calls read back out of a completion.

Invariants: a request renders exactly as ``tokenizer.apply_chat_template`` renders it with the
request's ``tools``, ``add_generation_prompt``, ``continue_final_message``, ``chat_template`` and
``chat_template_kwargs``, then is tokenized once, both in the render pool (:mod:`~rlvr.backends.serve.render`: bounded
in template length, rendered length and time) (special tokens added only when
``add_special_tokens`` asks: the template places its own). ``tools`` go only to a template that
reads them; otherwise the request is refused rather than the tools silently dropped. Tool calls
are parsed in the family the template teaches (:mod:`~rlvr.backends.serve.tool_calls`: Hermes / Qwen
``<tool_call>``, Llama-3 JSON, Mistral ``[TOOL_CALLS]``); a completion whose calls do not parse is
answered as plain text, as vLLM does. A forced ``tool_choice`` (``"required"`` or a named function)
is refused here; the recording proxy honours it by prefilling the call's opening
(:func:`forced_tool` names what to prefill).

A backend module: works on the tokenizer it is handed.
"""

from __future__ import annotations

import inspect
import json
import re
from typing import Any

from rlvr.backends.serve.render import RenderPool
from rlvr.backends.serve.requests import ChatBody
from rlvr.backends.serve.tool_calls import parse_hermes
from rlvr.errors import RequestError

_PARSED_CHOICES = (None, "auto")  # tool_choice values under which calls are parsed; "none" renders only


def _reserved() -> set[str]:
    from transformers import PreTrainedTokenizerBase

    return set(inspect.signature(PreTrainedTokenizerBase.apply_chat_template).parameters) - {"self", "kwargs"}


def chat_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as templates read them: text parts joined, a tool call's JSON ``arguments`` as a
    dict (what Hermes-style templates ``tojson``; vLLM converts them the same way)."""
    out = []
    for i, m in enumerate(messages):
        content = m.get("content")
        if isinstance(content, list):  # content parts: text only
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                raise RequestError(f"messages[{i}].content: only text parts are supported", "messages")
            if not all(isinstance(p.get("text", ""), str) for p in content):
                raise RequestError(f"messages[{i}].content: a text part's text must be a string", "messages")
            content = "".join(p.get("text", "") for p in content)
        if not isinstance(m.get("role"), str) or not isinstance(content, str | None):
            raise RequestError(f"messages[{i}] needs a string role and text content", "messages")
        message = {**m, "content": content or ""}
        if m.get("tool_calls") is not None:
            message["tool_calls"] = _calls_in(m["tool_calls"], i)
        out.append(message)
    return out


def _calls_in(calls: Any, i: int) -> list[dict[str, Any]]:
    if not isinstance(calls, list) or not all(isinstance(c, dict) and isinstance(c.get("function"), dict)
                                              for c in calls):
        raise RequestError(f"messages[{i}].tool_calls must be a list of {{\"function\": {{...}}}}", "messages")
    out = []
    for c in calls:
        function = dict(c["function"])
        args = function.get("arguments")
        if isinstance(args, str):
            try:
                function["arguments"] = json.loads(args) if args.strip() else {}
            except ValueError:
                raise RequestError(f"messages[{i}].tool_calls: arguments {args[:80]!r} is not JSON",
                                   "messages") from None
        out.append({**c, "function": function})
    return out


def _tools(body: ChatBody, template: str) -> list[dict[str, Any]] | None:
    if not body.tools:
        if body.tool_choice not in (None, "none", "auto"):
            raise RequestError("tool_choice names a tool but no tools were given", "tool_choice")
        return None
    for k, tool in enumerate(body.tools):
        function = tool.get("function")
        if tool.get("type", "function") != "function" or not isinstance(function, dict) \
                or not isinstance(function.get("name"), str) or not function["name"]:
            raise RequestError(f"tools[{k}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}",
                               "tools")
    if not re.search(r"\btools\b", template):
        raise RequestError("this model's chat template does not render tools (it never reads `tools`): send a "
                           "chat_template that does, or leave tools out", "tools")
    if body.tool_choice not in (None, "none", "auto"):
        raise RequestError(f"tool_choice={body.tool_choice!r} would need guided decoding, which rlvr serve does not "
                           "implement: use \"auto\" (calls parsed when the model makes them) or \"none\"; the "
                           "recording proxy (rlvr proxy, a run's agents) honours \"required\" and a named tool",
                           "tool_choice")
    return body.tools


def forced_tool(body: ChatBody) -> tuple[bool, str | None]:
    """Whether ``body.tool_choice`` forces a call (``"required"`` or a named function), and the
    function it names (``None``: any); a name that is not among ``tools`` is refused."""
    choice = body.tool_choice
    if choice == "required":
        if not body.tools:
            raise RequestError("tool_choice=\"required\" needs tools", "tool_choice")
        return True, None
    if not isinstance(choice, dict):
        if choice not in (None, "none", "auto"):
            raise RequestError(f"tool_choice={choice!r} is not one of \"none\", \"auto\", \"required\" or "
                               "{\"type\": \"function\", \"function\": {\"name\": ...}}", "tool_choice")
        return False, None
    name = (choice.get("function") or {}).get("name") if choice.get("type", "function") == "function" else None
    names = [(t.get("function") or {}).get("name") for t in body.tools or []]
    if not isinstance(name, str) or name not in names:
        raise RequestError(f"tool_choice names the function {name!r}, which is not among the tools {names}",
                           "tool_choice")
    return True, name


async def render(renderer: RenderPool, tokenizer: Any, body: ChatBody) -> tuple[list[int], bool]:
    """The prompt ids of a chat request, and whether tool calls are to be parsed from its answers:
    checked here, rendered and tokenized in ``renderer``'s workers, under its limits."""
    limit = renderer.limits.max_template_chars
    if body.chat_template is not None and len(body.chat_template) > limit:
        raise RequestError(f"chat_template has {len(body.chat_template)} characters, over the limit of {limit} "
                           f"({renderer.limits.command} --max-template-chars)", "chat_template", 413)
    template = body.chat_template or getattr(tokenizer, "chat_template", None)
    if not template:
        raise RequestError("this model's tokenizer has no chat template: use /v1/completions or send "
                           "chat_template", "messages")
    if not isinstance(template, str):
        raise RequestError("this model has several named chat templates: send chat_template", "chat_template")
    if body.continue_final_message and body.add_generation_prompt and "add_generation_prompt" in body.model_fields_set:
        raise RequestError("continue_final_message and add_generation_prompt cannot both be true",
                           "continue_final_message")
    if body.continue_final_message and body.messages[-1].get("role") != "assistant":
        raise RequestError("continue_final_message needs the last message to be the assistant's",
                           "continue_final_message")
    kwargs = dict(body.chat_template_kwargs or {})
    clash = sorted(set(kwargs) & _reserved())
    if clash:
        raise RequestError(f"chat_template_kwargs may not set {clash} (request fields or renderer options)",
                           "chat_template_kwargs")
    messages = chat_messages(body.messages)
    tools = _tools(body, template)
    chars = sum(len(m["content"]) for m in messages)
    if chars > renderer.limits.max_prompt_chars:
        raise RequestError(f"messages hold {chars} characters, over the limit of {renderer.limits.max_prompt_chars} "
                           f"({renderer.limits.command} --max-prompt-chars)", "messages", 413)
    options = dict(add_generation_prompt=body.add_generation_prompt and not body.continue_final_message,
                   continue_final_message=body.continue_final_message, **kwargs)
    ids = await renderer.chat(messages, tools=tools, chat_template=body.chat_template, options=options,
                              field="chat_template" if body.chat_template else "messages",
                              add_special_tokens=body.add_special_tokens)
    return ids, tools is not None and body.tool_choice in _PARSED_CHOICES


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """``(content, tool_calls)`` of a completion in the Hermes form: the text before the first
    ``<tool_call>`` (``None`` when empty) and each call in the OpenAI shape; ``(text, [])`` when any
    call does not parse."""
    return parse_hermes(text)
