"""Tool calls as the common model families write them, read back into the OpenAI shape, and the
opening each family's call starts with (what a forced ``tool_choice`` prefills).

Families (:data:`PARSERS`):

- ``hermes`` (Hermes, Qwen 2/2.5/3, SmolLM3 and most templates that read ``tools``):
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, after any text;
- ``llama3_json`` (Llama 3.1-3.3): the whole answer is ``{"name": ..., "parameters": {...}}``
  (several joined by ``;``), optionally after ``<|python_tag|>``;
- ``mistral``: ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`` after any text, or the
  newer ``[TOOL_CALLS]name[ARGS]{...}`` per call.

``auto`` picks the family from the chat template's own words (:func:`detect`), ``hermes`` when it
names none. Invariant: a completion whose calls do not all parse is answered as plain text, as vLLM
does; a parsed call's ``arguments`` is always a JSON string.

Standard library only.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Parsed = tuple[str | None, list[dict[str, Any]]]
_HERMES = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_MISTRAL_ARGS = re.compile(r"\[TOOL_CALLS\]\s*([^\[\s{]+)\s*\[ARGS\]", re.DOTALL)


def _call(name: Any, args: Any) -> dict[str, Any] | None:
    if not isinstance(name, str) or not name:
        return None
    return {"id": f"chatcmpl-tool-{uuid.uuid4().hex}", "type": "function",
            "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}


def _from_object(obj: Any, args_key: str) -> dict[str, Any] | None:
    if not isinstance(obj, dict):
        return None
    return _call(obj.get("name"), obj.get(args_key, obj.get("arguments", obj.get("parameters", {}))))


def _json_objects(text: str, sep: str) -> list[Any] | None:
    """Every JSON value in ``text``, one after another, ``sep`` (and blanks) between them; ``None``
    if anything else is there."""
    decoder, i = json.JSONDecoder(), 0
    out: list[Any] = []
    while True:
        while i < len(text) and (text[i].isspace() or (out and text[i] == sep)):
            i += 1
        if i == len(text):
            return out
        try:
            value, i = decoder.raw_decode(text, i)
        except ValueError:
            return None
        out.append(value)


def parse_hermes(text: str) -> Parsed:
    found = _HERMES.findall(text)
    if not found:
        return text, []
    calls = []
    for raw in found:
        try:
            call = _from_object(json.loads(raw.strip()), "arguments")
        except ValueError:
            return text, []
        if call is None:
            return text, []
        calls.append(call)
    content = text[:text.index("<tool_call>")].strip()
    return content or None, calls


def parse_llama3_json(text: str) -> Parsed:
    body = text.strip().removeprefix("<|python_tag|>").strip()
    if not body.startswith("{"):
        return text, []
    objects = _json_objects(body, ";")
    calls = [_from_object(o, "parameters") for o in objects or []]
    if not calls or any(c is None for c in calls):
        return text, []
    return None, calls  # type: ignore[return-value]


def parse_mistral(text: str) -> Parsed:
    if "[TOOL_CALLS]" not in text:
        return text, []
    content = text[:text.index("[TOOL_CALLS]")].strip() or None
    rest = text[text.index("[TOOL_CALLS]"):]
    named = _MISTRAL_ARGS.findall(rest)
    if named:  # [TOOL_CALLS]name[ARGS]{...}, once per call
        parts = re.split(r"\[TOOL_CALLS\]\s*[^\[\s{]+\s*\[ARGS\]", rest)[1:]
        calls = []
        for name, raw in zip(named, parts, strict=True):
            values = _json_objects(raw.strip(), ",")
            if not values or len(values) != 1:
                return text, []
            calls.append(_call(name, values[0]))
        return content, calls  # type: ignore[return-value]
    values = _json_objects(rest.replace("[TOOL_CALLS]", " "), ",")
    listed = [v for value in values or [] for v in (value if isinstance(value, list) else [value])]
    calls = [_from_object(v, "arguments") for v in listed]
    if not calls or any(c is None for c in calls):
        return text, []
    return content, calls  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class ToolParser:
    """One family: how its calls are read back and how one opens (``{name}``: a named tool's)."""

    name: str
    parse: Callable[[str], Parsed]
    opening: str  # a call with its name still to write
    named_opening: str  # a call of the tool ``{name}``, its arguments still to write
    special: bool  # its markers are special tokens: read the text with special tokens kept

    def prefill(self, tool: str | None) -> str:
        return self.opening if tool is None else self.named_opening.replace("{name}", json.dumps(tool)[1:-1])


PARSERS = {
    "hermes": ToolParser("hermes", parse_hermes, '<tool_call>\n{"name": "',
                         '<tool_call>\n{"name": "{name}", "arguments": ', special=False),
    "llama3_json": ToolParser("llama3_json", parse_llama3_json, '{"name": "', '{"name": "{name}", "parameters": ',
                              special=True),
    "mistral": ToolParser("mistral", parse_mistral, '[TOOL_CALLS] [{"name": "',
                          '[TOOL_CALLS] [{"name": "{name}", "arguments": ', special=True),
}
CHOICES = ("auto", *PARSERS)


def detect(template: str | None) -> ToolParser:
    """The family a chat template teaches, from its own words; Hermes when it names none."""
    template = template or ""
    if "[TOOL_CALLS]" in template:
        return PARSERS["mistral"]
    if "<tool_call>" in template:
        return PARSERS["hermes"]
    if "<|python_tag|>" in template or ("ipython" in template and '"parameters"' in template):
        return PARSERS["llama3_json"]
    return PARSERS["hermes"]


def parser_for(setting: str, template: str | None) -> ToolParser:
    """The family named by ``setting`` (one of :data:`CHOICES`), ``auto`` read from ``template``."""
    if setting == "auto":
        return detect(template)
    if setting not in PARSERS:
        raise ValueError(f"tool parser {setting!r} is not one of {', '.join(CHOICES)}")
    return PARSERS[setting]


def completion_text(tokenizer: Any, ids: Any, text: str, parser: ToolParser) -> str:
    """The text ``parser`` reads: ``text`` as answered, or for a family whose markers are special
    tokens, the ids decoded with special tokens kept (the end-of-turn tokens at the end dropped)."""
    if not parser.special:
        return text
    ids = list(ids)
    specials = set(getattr(tokenizer, "all_special_ids", ()) or ())
    markers = {tokenizer.convert_tokens_to_ids(t) for t in ("[TOOL_CALLS]", "[ARGS]", "<|python_tag|>")}
    while ids and ids[-1] in specials and ids[-1] not in markers:
        ids.pop()
    return tokenizer.decode(ids, skip_special_tokens=False)
