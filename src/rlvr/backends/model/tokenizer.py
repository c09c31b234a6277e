"""The chat tokenizer the rollout functions use, over a Hugging Face tokenizer.

A backend module: the tokenizer it wraps comes from transformers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlvr.backends.model.io import render_prompt_ids


class HFChatTokenizer:
    """:class:`~rlvr.protocols.ChatTokenizer` over a Hugging Face tokenizer."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    def render(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        return render_prompt_ids(self.tokenizer, messages)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)
