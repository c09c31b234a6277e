"""How rlvr asks an in-process vLLM engine for things: the engine's arguments and each request's.

:func:`engine_kwargs` builds the ``vllm.LLM(...)`` arguments of a colocated engine, always with
what the trainer relies on:

- ``logprobs_mode="processed_logprobs"``: the log-prob of each sampled token under the distribution
  it was drawn from (after temperature, top-k/top-p/min-p and the allowed/forbidden tokens), the
  one the trainer recomputes; vLLM's default is the raw model's;
- ``generation_config="vllm"``: no sampling defaults from the model folder's
  ``generation_config.json`` (top-k, repetition penalty) that the trainer knows nothing of;
- the engine core and its one worker in this process (``distributed_executor_backend="uni"``,
  ``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so the model lives beside the trainer's and weights are
  handed over as tensors;
- a bounded KV cache: ``kv_cache_gib`` whole GiB, else 1 GiB on the CPU (vLLM's CPU default
  reserves most of the machine's memory) and ``gpu_memory_utilization=0.3`` on a GPU (TRL's colocate
  default: the trainer keeps the rest);
- ``enable_sleep_mode`` on CUDA only (vLLM's CPU backend has no sleep mode).

``vllm_args`` (``sampler.vllm_args``, vLLM's own command-line flags) are read with vLLM's parser and
override the defaults, except the flags whose values the points above depend on, which are refused.

:func:`request_kwargs` maps an rlvr :class:`~rlvr.types.SamplingParams` to vLLM's, field by field; a
field it does not know (set to anything but its default) is refused, never dropped.

:func:`start_llm` builds the engine and puts back what vLLM changes process-wide on the way (torch's
thread count, which its CPU worker lowers to 1 and then pins by replacing ``torch.set_num_threads``).

A backend module: imports torch; vLLM only inside the functions that need it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import torch

from rlvr.errors import BackendError, ConfigError
from rlvr.types import SamplingParams

GIB = 1 << 30
CPU_KV_CACHE_GIB = 1
GPU_MEMORY_UTILIZATION = 0.3
SEED_MODULUS = 1 << 63  # vLLM keeps a request's seed in an int64
# Flags rlvr sets itself: a different value would break the log-probs, the in-memory weight handover
# or the single device the trainer shares.
OWNED_FLAGS = {
    "model": "the run's base", "dtype": "model.dtype", "seed": "loop.seed",
    "logprobs_mode": "processed log-probs are what the trainer recomputes",
    "generation_config": "no sampling defaults from the model folder",
    "distributed_executor_backend": "the engine runs in this process",
    "tensor_parallel_size": "one device, the trainer's", "pipeline_parallel_size": "one device, the trainer's",
    "data_parallel_size": "one device, the trainer's", "enable_sleep_mode": "sampler.vllm_sleep",
    "kv_cache_memory_bytes": "sampler.vllm_kv_cache_gib", "enable_lora": "LoRA weights are merged before each push",
}


def engine_kwargs(model_dir: str, *, dtype: str, seed: int, device: str, kv_cache_gib: int | None = None,
                  sleep: bool = False, vllm_args: Sequence[str] = ()) -> dict[str, Any]:
    """The ``vllm.LLM`` arguments of a colocated engine on ``device`` ("cpu" or "cuda")."""
    kwargs: dict[str, Any] = {
        "model": str(model_dir), "dtype": dtype, "seed": seed, "logprobs_mode": "processed_logprobs",
        "generation_config": "vllm", "distributed_executor_backend": "uni", "tensor_parallel_size": 1,
    }
    cuda = device.startswith("cuda")
    if kv_cache_gib is not None or not cuda:
        kwargs["kv_cache_memory_bytes"] = (kv_cache_gib or CPU_KV_CACHE_GIB) * GIB
    else:
        kwargs["gpu_memory_utilization"] = GPU_MEMORY_UTILIZATION
    if sleep and cuda:
        kwargs["enable_sleep_mode"] = True
    return {**kwargs, **user_engine_args(vllm_args)}


def user_engine_args(flags: Sequence[str]) -> dict[str, Any]:
    """``sampler.vllm_args`` as ``vllm.LLM`` keyword arguments: the values vLLM's own parser reads
    that differ from its defaults. A flag rlvr owns (:data:`OWNED_FLAGS`) is refused, naming why."""
    if not flags:
        return {}
    named = {f.removeprefix("--").split("=", 1)[0].replace("-", "_") for f in flags if f.startswith("--")}
    owned = sorted(named & set(OWNED_FLAGS))
    if owned:
        key = owned[0]
        raise ConfigError(f"sampler.vllm_args sets --{key.replace('_', '-')}, which sampler.backend = 'vllm_colocate' "
                          f"sets itself ({OWNED_FLAGS[key]}); remove it")
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser(prog="sampler.vllm_args"))
    try:
        namespace = parser.parse_args(list(flags))
    except SystemExit:
        raise ConfigError(f"sampler.vllm_args={list(flags)!r}: vLLM's parser refused them (its message is above); "
                          "give vLLM engine flags such as '--enforce-eager' or '--max-num-seqs=64'") from None
    return {k: v for k, v in vars(namespace).items() if v != parser.get_default(k) and k not in OWNED_FLAGS}


def request_kwargs(params: SamplingParams, seed: int, stop_ids: Sequence[int]) -> dict[str, Any]:
    """``vllm.SamplingParams`` arguments for one sample of ``params`` drawn with ``seed``.

    The sampled tokens' log-probs come back flat (one entry per token, no top-k alternatives); every
    id in ``stop_ids`` (the policy's eos ids) ends a completion as ``params.stop_token_ids`` do, and is
    kept in it. Token-id bad words go to vLLM's tokenized form directly (``_bad_words_token_ids``,
    the list vLLM builds from text bad words), since its API takes them as text only."""
    unmapped = [f.name for f in dataclasses.fields(params) if f.name not in _MAPPED
                and getattr(params, f.name) != f.default]
    if unmapped:
        raise BackendError(f"the colocated vLLM engine does not map SamplingParams.{unmapped[0]} "
                           f"(={getattr(params, unmapped[0])!r}); leave it at its default or use the in-process engine")
    kwargs: dict[str, Any] = {
        "max_tokens": params.max_tokens, "temperature": params.temperature, "top_p": params.top_p,
        "seed": seed % SEED_MODULUS, "logprobs": 0, "flat_logprobs": True,
        "stop_token_ids": sorted(set(params.stop_token_ids) | set(stop_ids)),
        # Text is only needed to find stop strings; the trainer reads token ids.
        "detokenize": bool(params.stop),
    }
    if params.stop:
        kwargs["stop"] = list(params.stop)
    if params.allowed_token_ids is not None:
        kwargs["allowed_token_ids"] = list(params.allowed_token_ids)
    if params.bad_words_ids:
        kwargs["_bad_words_token_ids"] = [list(w) for w in params.bad_words_ids]
    top_k = getattr(params, "top_k", None)
    if top_k:  # 0 or None: off, as in vLLM
        kwargs["top_k"] = top_k
    min_p = getattr(params, "min_p", None)
    if min_p:
        kwargs["min_p"] = min_p
    return kwargs


# SamplingParams fields request_kwargs carries over (top_k and min_p where the dataclass has them).
_MAPPED = {"max_tokens", "temperature", "top_p", "stop", "stop_token_ids", "allowed_token_ids", "bad_words_ids",
           "top_k", "min_p"}


def score_kwargs() -> dict[str, Any]:
    """``vllm.SamplingParams`` arguments that score a prompt: the log-prob of every prompt token given
    those before it, which vLLM computes from the raw model (temperature 1) whatever the logprobs mode;
    one greedy token is generated and ignored."""
    return {"max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0, "flat_logprobs": True, "detokenize": False}


def start_llm(kwargs: dict[str, Any]) -> Any:
    """``vllm.LLM(**kwargs)`` in this process, with torch's thread count and ``torch.set_num_threads``
    as they were before (the trainer shares them)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process, not a child
    threads, set_threads = torch.get_num_threads(), torch.set_num_threads
    try:
        from vllm import LLM
    except ImportError as exc:
        raise ConfigError(f"sampler.backend = 'vllm_colocate' runs vLLM inside the training process, but this "
                          f"Python cannot import it ({exc}); run rlvr from vLLM's environment (`make vllm` builds "
                          ".venv-vllm with rlvr's train extra: .venv-vllm/bin/rlvr train ...)") from None
    try:
        return LLM(**kwargs)
    finally:
        torch.set_num_threads = set_threads
        set_threads(threads)


def device_used_gb() -> float | None:
    """Memory in use on the current CUDA device, all allocators and processes (driver's count); None
    without CUDA."""
    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info()
    return round((total - free) / 1e9, 3)
