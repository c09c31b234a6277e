"""Compiled decoding (``sampler.compile``): a static KV cache and the compiled forward in ``generate``.

On a GPU a decode step of a small batch is bound by kernel launches, not by arithmetic: a static
KV cache (fixed shapes) lets transformers compile the model's forward with ``torch.compile`` in
``reduce-overhead`` mode, which replays each decode step as one CUDA graph. The draw itself
(:class:`~rlvr.backends.sample.batched.SeededDraw`) runs eagerly on the step's logits as before,
so a compiled and an eager decode draw the same tokens wherever their logits agree; they differ
only by the compiled kernels' rounding (the test states the tolerance).

A compiled forward is specialised to its shapes, so batches are shaped into a few buckets: the
row count is padded up to a power of two (then to a multiple of 64) with copies of the first row
whose completions are thrown away, and prompts are left-padded to a multiple of
:data:`WIDTH_BUCKET` columns. Shared prompts (a copied dynamic KV cache) are not used under
compilation: on a GPU, where this pays, reading a short prompt per row costs little.

Transformers compiles on CUDA (and XPU) only unless told otherwise; this module tells it to
compile on any device, so the equivalence can be tested on a CPU (slowly: minutes of compiling).

A backend module: imports torch and transformers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import CompileConfig

WIDTH_BUCKET = 32  # prompt columns are padded to a multiple of this
ROW_BUCKETS_UP_TO = 64  # rows: the next power of two up to this, then the next multiple of it


def bucketed_rows(rows: int) -> int:
    """The batch size a batch of ``rows`` is padded to."""
    if rows <= ROW_BUCKETS_UP_TO:
        return 1 << max(rows - 1, 0).bit_length()
    return -(-rows // ROW_BUCKETS_UP_TO) * ROW_BUCKETS_UP_TO


def padded_batch(prompts: Sequence[Sequence[int]], seeds: Sequence[int]) -> tuple[list[Sequence[int]], list[int]]:
    """``prompts`` and ``seeds`` padded to :func:`bucketed_rows` rows with copies of the first row
    (each row is drawn on its own, so the spare rows change nothing for the real ones)."""
    spare = bucketed_rows(len(prompts)) - len(prompts)
    return [*prompts, *[prompts[0]] * spare], [*seeds, *[seeds[0]] * spare]


def bucketed_width(prompts: Sequence[Sequence[int]]) -> int:
    """The left-padded width of a compiled batch: the longest prompt rounded up to :data:`WIDTH_BUCKET`."""
    longest = max(map(len, prompts))
    return -(-longest // WIDTH_BUCKET) * WIDTH_BUCKET


def static_cache_options(device: torch.device) -> dict[str, Any]:
    """``GenerationConfig`` fields for a static cache and a compiled decode forward on ``device``."""
    config = CompileConfig(fullgraph=False, mode="reduce-overhead" if device.type == "cuda" else "default")
    config._compile_all_devices = device.type != "cuda"  # type: ignore[assignment]  # transformers' switch for compiling off CUDA
    return {"cache_implementation": "static", "compile_config": config}


def prepare_thread() -> None:
    """Set up, in the calling thread, the per-thread state torch's CUDA graph trees keep. Some torch
    releases create it only in the thread that imported inductor and fail an assertion in any
    other (the engines decode in worker threads); where torch creates it lazily this does nothing."""
    try:
        from torch._inductor import cudagraph_trees
        if not torch._C._is_key_in_tls("tree_manager_containers"):
            cudagraph_trees._initialize_tls(cudagraph_trees.local)
    except (ImportError, AttributeError):  # a torch without these internals: nothing to prepare
        pass
