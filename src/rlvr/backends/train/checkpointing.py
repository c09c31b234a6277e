"""Activation (gradient) checkpointing of the policy's decoder layers for the train step.

:func:`enable_gradient_checkpointing` is what TRL's ``gradient_checkpointing=True`` and verl's
``enable_gradient_checkpointing`` do: transformers' own layer checkpointing, non-reentrant
(``torch.utils.checkpoint(use_reentrant=False)``), so a LoRA adapter inside a frozen body and
parameters reached outside a layer's inputs (the shared prompts' KV cache) get their gradients.
Each decoder layer keeps only its input during the forward; the backward reruns the layer's
forward (about one more forward pass per step) and frees its activations before the next layer's.
Dropout replays the same mask (the RNG state is restored). It acts only with gradients on and in
train mode: sampling, scoring, the reference and old-policy passes (all under ``no_grad``) run
unchanged on the same model.

The shared-prompt path (:mod:`~rlvr.backends.train.shared_prefix`) passes a KV cache through
checkpointed layers: transformers drops a cache given to a checkpointed layer unless the layer is
marked to keep it (``_can_checkpoint_with_cache``), because a rerun of a plain cache would append
twice. The trainer's cache (:class:`~rlvr.backends.train.shared_prefix.ReplayableCache`) is safe to
rerun, and no other pass of the policy gives a cache with gradients on, so the layers are marked.
:func:`keeps_cache_when_checkpointed` says whether that holds for a model (a transformers without
the mark drops the cache: the trainer then reads such micro-batches padded).

A backend module: imports torch and transformers.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rlvr.errors import BackendError

_CHECKPOINT_LAYER: type | None
try:
    from transformers.modeling_layers import GradientCheckpointingLayer as _CHECKPOINT_LAYER
except ImportError:  # an older transformers: layers checkpointed by the model's own loop
    _CHECKPOINT_LAYER = None


def _inner(model: Any) -> Any:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def enable_gradient_checkpointing(model: Any) -> None:
    """Checkpoint every decoder layer of ``model`` (a PEFT-wrapped one included), non-reentrant; mark the
    layers to keep a KV cache they are given (see the module docstring)."""
    inner = _inner(model)
    if not getattr(inner, "supports_gradient_checkpointing", False):
        raise BackendError(f"train.gradient_checkpointing: {type(inner).__name__} does not support activation "
                           "checkpointing in transformers; set train.gradient_checkpointing = false")
    enable = getattr(inner, "activation_checkpointing_enable", None) or inner.gradient_checkpointing_enable
    enable({"use_reentrant": False})
    for module in inner.modules():
        if _CHECKPOINT_LAYER is not None and isinstance(module, _CHECKPOINT_LAYER) \
                and hasattr(module, "_can_checkpoint_with_cache"):
            module._can_checkpoint_with_cache = True


def is_checkpointed(model: Any) -> bool:
    """Whether any layer of ``model`` checkpoints its activations."""
    return any(getattr(m, "gradient_checkpointing", False) is True for m in _inner(model).modules())


@contextmanager
def checkpointing_paused(model: Any) -> Iterator[None]:
    """Checkpointing off for the duration (the micro-batch sizer's probe of full activations)."""
    paused = [m for m in _inner(model).modules() if getattr(m, "gradient_checkpointing", False) is True]
    for module in paused:
        module.gradient_checkpointing = False
    try:
        yield
    finally:
        for module in paused:
            module.gradient_checkpointing = True


def keeps_cache_when_checkpointed(model: Any) -> bool:
    """Whether every checkpointed layer of ``model`` keeps a KV cache it is given (true when none is
    checkpointed). False where a transformers layer would drop it, or checkpointing lives in a model's
    own layer loop (transformers before the per-layer checkpointing class)."""
    for module in _inner(model).modules():
        if getattr(module, "gradient_checkpointing", False) is not True:
            continue
        if _CHECKPOINT_LAYER is None:
            return False
        if isinstance(module, _CHECKPOINT_LAYER) and not getattr(module, "_can_checkpoint_with_cache", False):
            return False
    return True
