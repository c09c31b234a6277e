"""What the trackers share: a run's config flattened to ``a.b.c`` keys, and sample rows as a
Markdown table (for TensorBoard's text plugin). Standard library only."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from rlvr.record.history import flatten

SAMPLE_COLUMNS = ("step", "task_id", "sample", "prompt", "completion", "reward", "advantage", "version")


def as_text(value: Any) -> str:
    """A config value as one string (JSON for anything but a plain string)."""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False)


def safe_key(key: str) -> str:
    """A key trackers accept (letters, digits, ``_-./`` and spaces); anything else becomes ``_``."""
    return re.sub(r"[^\w\-./ ]", "_", key)


def _cell(value: Any) -> str:
    text = f"{value:.4g}" if isinstance(value, float) else str(value)
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", "⏎")


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] = SAMPLE_COLUMNS) -> str:
    head = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
    return head + "".join("| " + " | ".join(_cell(r.get(c, "")) for c in columns) + " |\n" for r in rows)


def config_markdown(config: Mapping[str, Any]) -> str:
    """The flattened config as a two-column Markdown table."""
    return "| key | value |\n|---|---|\n" + "".join(
        f"| {_cell(k)} | {_cell(as_text(v))} |\n" for k, v in sorted(flatten(config).items()))
