"""The chat tokenizer the rollout functions use, over a Hugging Face tokenizer.

With ``tools`` (OpenAI function schemas, an environment's), every rendering passes them to the
chat template, so they reach the prompt the way the model was taught to read them; a template
that never reads ``tools`` is refused rather than dropping them silently. ``template_kwargs``
(``[task] chat_template_kwargs``, e.g. ``enable_thinking=False``) go to every rendering too.
A backend module: the tokenizer it wraps comes from transformers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlvr.backends.model.io import render_prompt_ids
from rlvr.errors import ConfigError


class HFChatTokenizer:
    """:class:`~rlvr.protocols.ChatTokenizer` over a Hugging Face tokenizer."""

    def __init__(self, tokenizer: Any, tools: Sequence[Mapping[str, Any]] | None = None,
                 template_kwargs: Mapping[str, Any] | None = None):
        self.tokenizer = tokenizer
        self.tools = list(tools) if tools else None
        self.template_kwargs = dict(template_kwargs or {})
        if self.tools:
            template = getattr(tokenizer, "chat_template", None)
            names = [t.get("function", t).get("name") for t in self.tools]
            if not isinstance(template, str) or "tools" not in template:
                raise ConfigError(f"the environment has tools {names}, but the model's chat template "
                                  f"{'is missing' if not template else 'never reads `tools`'}, so they would "
                                  "never reach the prompt; use a model whose chat template renders tools")

    def with_tools(self, tools: Sequence[Mapping[str, Any]] | None) -> HFChatTokenizer:
        """This tokenizer rendering ``tools`` into every prompt (itself when there are none)."""
        return HFChatTokenizer(self.tokenizer, tools, self.template_kwargs) if tools else self

    def render(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        return render_prompt_ids(self.tokenizer, messages, self.tools, self.template_kwargs)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)


def chat_template_text(spec: str, field: str) -> str:
    """The chat template ``spec`` names: a file's text, or ``spec`` itself when it is a template
    (it holds ``{{`` or ``{%``); anything else is refused naming ``field``."""
    if "{{" in spec or "{%" in spec:
        return spec
    path = Path(spec).expanduser()
    if not path.is_file():
        raise ConfigError(f"{field}={spec!r}: no such file (give a Jinja chat template file, or the template text)")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{field}={spec!r}: cannot read it: {exc}") from None
    if "{{" not in text and "{%" not in text:
        raise ConfigError(f"{field}={spec!r}: the file is not a Jinja chat template (no {{{{ or {{% in it)")
    return text


def use_chat_template(tokenizer: Any, spec: str | None, field: str) -> Any:
    """``tokenizer`` rendering with the template ``spec`` names (``None``: as it is)."""
    if spec is not None:
        tokenizer.chat_template = chat_template_text(spec, field)
    return tokenizer

