"""Mixed precision for the train step: the transformer body under bf16 autocast, the output head in float32.

``TRAIN_AUTOCAST`` names what ``[train] autocast`` accepts. Under ``"bfloat16"`` the weights, the
LoRA adapter, its gradients and the optimizer state stay float32 (autocast casts each matmul's
inputs, never a parameter), so an update is as fine-grained as without it; only the body's
matmuls run in bf16, which a CPU with AVX-512 BF16 or AMX (or a GPU) does faster. The output head
(hidden state × vocabulary) and the log-softmax run in float32 outside autocast: a bf16 logit of
magnitude 20 is off by up to 0.06, which would show directly in every log-prob. The split is what
lets the head run on the scored positions only, in chunks (:mod:`~rlvr.backends.model.head`,
:func:`~rlvr.backends.model.io.selected_logprobs`), whatever the precision.

Invariant: :func:`split_head` returns a body and head only for a model whose logits are exactly
``head(body(...).last_hidden_state)``; a model that rescales or caps its logits afterwards, or an
FSDP2-sharded one (its own forward gathers the parameters), gets ``None`` and is run whole (its
head then under autocast too).

A backend module: imports torch.
"""

from __future__ import annotations

import contextlib
from typing import Any, Literal

import torch

TRAIN_AUTOCAST = ("none", "bfloat16")
Autocast = Literal["none", "bfloat16"]

# Config fields of models whose forward changes the head's logits (Gemma's soft cap, Cohere's scale).
_LOGIT_POSTPROCESSING = ("final_logit_softcapping", "logit_scale", "output_multiplier_scale")


def autocast(mode: str, device: str) -> contextlib.AbstractContextManager:
    """The context the body's forward (and its backward) runs under for ``mode``."""
    if mode == "none":
        return contextlib.nullcontext()
    if mode != "bfloat16":
        raise ValueError(f"autocast must be one of {TRAIN_AUTOCAST}, got {mode!r}")
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)


def split_head(model: Any) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """``(body, head)`` of a causal LM (a PEFT-wrapped one included: its adapters live inside these
    modules), or ``None`` when the model has no such plain split."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    if _sharded(model) or _sharded(inner):  # its own forward gathers the parameters the body and head use
        return None
    get_body, get_head = getattr(inner, "get_decoder", None), getattr(inner, "get_output_embeddings", None)
    if get_body is None or get_head is None:
        return None
    config = getattr(inner, "config", None)
    if any(getattr(config, name, None) not in (None, 1, 1.0) for name in _LOGIT_POSTPROCESSING):
        return None
    body, head = get_body(), get_head()
    if body is None or head is None or body is inner:
        return None
    return body, head


def _sharded(module: Any) -> bool:
    """Whether ``module`` is an FSDP2 root: calling its children directly would skip its all-gather."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch built without distributed
        return False
    return isinstance(module, FSDPModule)
