"""What the tests against a real vLLM share: its interpreter (or a skip that says how to get one)
and a started server. ``RLVR_REQUIRE_VLLM=1`` (CI sets it) turns the skip into a failure, so a
broken `make vllm` cannot pass unnoticed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rlvr.errors import ConfigError


def vllm_python() -> str:
    from rlvr.backends.serve.vllm import find_vllm_python

    try:
        return find_vllm_python()
    except ConfigError as exc:
        if os.environ.get("RLVR_REQUIRE_VLLM"):
            pytest.fail(f"RLVR_REQUIRE_VLLM is set but no vLLM was found: {exc}")
        pytest.skip(f"no vLLM: {exc}")


# Tests start many servers, so each starts lean. Eager mode skips the ~20 s compile warm-up. The
# engine runs its model in its own process (the uni executor, which vLLM's CPU platform allows only
# with VLLM_ENABLE_V1_MULTIPROCESSING=0) instead of spawning a third process that imports vLLM and
# torch once more (measured on two busy cores: 64 s to ready instead of 88-98 s).
LEAN_ARGS = ["--enforce-eager", "--distributed-executor-backend=uni"]
LEAN_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
FAST_START = {"kv_cache_gib": 1, "vllm_args": LEAN_ARGS, "env": LEAN_ENV}


def vllm_server(model_dir: Path, log_dir: Path, **kwargs):
    """A :class:`VLLMServer` on ``model_dir``, quick to start, with a small CPU KV cache (not started)."""
    from rlvr.backends.serve.vllm import VLLMServer

    return VLLMServer(model_dir, python=vllm_python(), log_path=log_dir / "vllm.log", **FAST_START, **kwargs)


def start_vllm(model_dir: Path, log_dir: Path, **kwargs):
    """A started :func:`vllm_server`; stop it when done."""
    return vllm_server(model_dir, log_dir, **kwargs).start()
