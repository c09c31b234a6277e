"""Answer extraction and normalisation shared by the verifiers.

- :func:`last_assistant_text`: the text of the model's last turn in a conversation.
- :func:`last_boxed`: the content of the last complete ``\\boxed{...}`` (balanced braces).
- :func:`answer_tag`: the content of the last ``<answer>...</answer>``.
- :func:`last_number`: the last number in a text (``-1,234.5`` style).
- :func:`extract`: the first of those that finds something, in an order you choose.
- :func:`normalize`: the canonical form two answers are compared in.

Every extractor returns ``None`` when it finds nothing, never raises on odd text.
Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

_BOXED = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_SPACES = re.compile(r"\s+")
_MINUS_SIGNS = str.maketrans({"\u2212": "-", "\u2013": "-"})
EXTRACTORS = ("tags", "boxed", "number")


def content_text(content: Any) -> str:
    """A message's ``content`` as text: a string as is, OpenAI-style parts joined, else ``""``."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and not isinstance(content, (bytes, bytearray)):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
        return "".join(parts)
    return ""


def last_assistant_text(messages: Sequence[Mapping[str, Any]], *, who: str = "reward_fn") -> str:
    """The text of the last assistant message.

    A conversation without an assistant message is a caller bug, not a wrong answer: it raises
    ``ValueError`` naming ``who``.
    """
    for message in reversed(messages):
        if isinstance(message, Mapping) and message.get("role") == "assistant":
            return content_text(message.get("content"))
    raise ValueError(f"{who}: messages hold no assistant message; pass the conversation including the "
                     "model's reply as {'role': 'assistant', 'content': ...}")


def last_boxed(text: str) -> str | None:
    """The content of the last complete ``\\boxed{...}`` (or ``\\fbox{...}``), outermost first.

    Braces are matched with nesting (``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``); escaped
    braces ``\\{``/``\\}`` do not count. An unclosed ``\\boxed{`` (a truncated reply) is skipped,
    so the last *complete* one wins. ``\\boxed 5`` (no braces) gives ``5``.
    """
    if not isinstance(text, str):
        return None
    found: str | None = None
    pos = 0
    while True:
        match = _BOXED.search(text, pos)
        if match is None:
            return found
        i = match.end()
        while i < len(text) and text[i] in " \t":
            i += 1
        if i < len(text) and text[i] == "{":
            end = _closing_brace(text, i)
            if end is None:
                pos = match.end()
                continue
            found, pos = text[i + 1 : end], end + 1
        else:
            word = re.match(r"[^\s$]+", text[i:]) if i > match.end() else None
            if word:
                found = word.group(0)
            pos = match.end()


def _closing_brace(text: str, start: int) -> int | None:
    depth = 0
    i = start
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def answer_tag(text: str, tag: str = "answer", *, allow_unclosed: bool = False) -> str | None:
    """The stripped content of the last ``<tag>...</tag>`` (case-insensitive), or ``None``.

    ``allow_unclosed``: also accept a final ``<tag>`` with no closing tag (the text up to the end),
    for samplers that stop on ``</tag>`` and strip it.
    """
    if not isinstance(text, str):
        return None
    name = re.escape(tag)
    closed = re.findall(rf"<{name}>(.*?)</{name}>", text, flags=re.DOTALL | re.IGNORECASE)
    opening = [m.end() for m in re.finditer(rf"<{name}>", text, flags=re.IGNORECASE)]
    if allow_unclosed and opening:
        tail = text[opening[-1]:]
        if not re.search(rf"</{name}>", tail, flags=re.IGNORECASE):
            return tail.strip()
    return closed[-1].strip() if closed else None


def last_number(text: str) -> str | None:
    """The last number in ``text`` as written (``"1,234.5"``, ``"-3"``, ``".5"``), or ``None``.

    A sentence's final period is not part of the number (``"is 42."`` gives ``"42"``).
    """
    if not isinstance(text, str):
        return None
    found = _NUMBER.findall(text.translate(_MINUS_SIGNS))
    return found[-1] if found else None


def extract(text: str, methods: Sequence[str] = EXTRACTORS, *, tag: str = "answer") -> str | None:
    """The answer found by the first of ``methods`` (``"tags"``, ``"boxed"``, ``"number"``) that finds one."""
    for method in methods:
        if method == "tags":
            found = answer_tag(text, tag)
        elif method == "boxed":
            found = last_boxed(text)
        elif method == "number":
            found = last_number(text)
        else:
            raise ValueError(f"extract: unknown method {method!r}; known: {EXTRACTORS}")
        if found is not None:
            return found
    return None


def normalize(text: Any, *, casefold: bool = False, remove_spaces: bool = True) -> str:
    """The canonical form of an answer for comparison.

    Strips surrounding whitespace, removes ``$`` signs, thousands separators (``1,234`` becomes
    ``1234``; ``1,2,3`` is left alone) and a trailing period; maps unicode minus signs to ``-``;
    removes all whitespace (``remove_spaces``, the default) or collapses runs of it to one space;
    casefolds when asked. Non-strings are converted with ``str`` first.
    """
    s = text if isinstance(text, str) else str(text)
    s = s.translate(_MINUS_SIGNS).replace("$", "").strip()
    s = _THOUSANDS.sub("", s)
    s = _SPACES.sub("" if remove_spaces else " ", s).strip()
    s = s.rstrip(".").rstrip()
    return s.casefold() if casefold else s
