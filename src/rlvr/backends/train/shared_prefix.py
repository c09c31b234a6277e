"""Shared prompts in a train micro-batch: each distinct prompt is read once, forward and backward.

A GRPO step trains ``group_k`` completions of every prompt, and a micro-batch holds whole groups in
order, so 16 rows of a step with ``group_k = 8`` carry 2 distinct prompts. With a 45-token chat
prompt and 13-token completions, the padded layout spends three quarters of its matmuls re-reading
prompts. :func:`shared_prompt_logprobs` instead runs the model once over each distinct prompt but
its last token, keeping the key/value cache *with its graph*, copies that cache to every row that
repeats the prompt (an ``index_select``, so the backward pass sums each copy's gradient into the one
prefix), and then runs only ``[last prompt token, completion[:-1]]`` per row against it. Position
``j`` of that second pass predicts completion token ``j``, exactly as position ``p - 1 + j`` does in
the padded layout.

Layout of the two passes: prompts right-padded in the first (no query row is ever fully masked, so
no kernel sees an empty softmax), the second's attention mask the copied prompt mask followed by
each row's own, position ids continuing from each prompt's real length. Padding keys are masked,
so they contribute exactly nothing: log-probs, entropies and gradients equal the padded layout's
within float32 rounding (the test checks 1e-5).

Under activation checkpointing (``[train] gradient_checkpointing``) both passes are checkpointed
layer by layer: the backward reruns each layer's forward, and the KV cache they share is a
:class:`ReplayableCache`, which a rerun reads exactly as the first run did and never writes twice.

Invariant: :func:`shared_prompt_logprobs` returns ``None`` (the caller reads the batch padded) when
no prompt repeats in the micro-batch or a prompt has fewer than two tokens.

A backend module: imports torch and transformers.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from transformers import DynamicCache

from rlvr.backends.model import precision
from rlvr.backends.model.io import cache_kwarg, completion_positions, selected_logprobs, spread
from rlvr.backends.model.prefill import copied_cache, distinct
from rlvr.backends.train.checkpointing import keeps_cache_when_checkpointed


class ReplayableCache(DynamicCache):
    """The shared prefixes' KV cache, safe to replay under activation checkpointing (the backward reruns
    each checkpointed layer's forward, and a plain cache would be appended to a second time).

    The prefix pass fills it: a layer's first update is stored and returned, and a replay of that pass
    (which comes in the backward, after the tail pass) returns its keys and stores nothing. The tail
    pass reads it through :meth:`reader`, a copy over the same stored prefixes whose update returns
    the prefix followed by the new keys and stores nothing, so a replayed tail layer sees exactly
    what it first saw. Without checkpointing the two read as one plain ``DynamicCache``."""

    frozen = False

    def reader(self) -> ReplayableCache:
        """The tail pass's view: the same stored (copied) prefixes, read only."""
        view = copy.copy(self)
        view.frozen = True
        return view

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        stored: Any = self.layers[layer_idx] if layer_idx < len(self.layers) else None  # a KV layer
        if self.frozen:
            return torch.cat([stored.keys, key_states], dim=-2), torch.cat([stored.values, value_states], dim=-2)
        if stored is not None and stored.is_initialized:  # the prefix pass, replayed
            return key_states, value_states
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)


def shared_prompt_logprobs(model: Any, batch: dict[str, Any], temperature: float, *,
                           with_entropy: bool = False, autocast: str = "none"):
    """[B, C] completion log-probs of a packed batch (zeros past each completion), each distinct
    prompt read once; with ``with_entropy`` also each scored position's entropy. ``None`` when no
    prompt repeats, a prompt has a single token, or the model checkpoints layers that would drop a
    cache (an older transformers)."""
    ids, prompt_lens, completion_lens = batch["ids"], batch["prompt_lens"], batch["completion_lens"]
    prompts = [tuple(row[:p]) for row, p in zip(ids.tolist(), prompt_lens, strict=True)]
    first, index = distinct(prompts)
    if len(first) == len(prompts) or min(prompt_lens) < 2 or not keeps_cache_when_checkpointed(model):
        return None
    device, c_max = ids.device, batch["c_max"]
    width = max(map(len, first)) - 1  # the prefix: every prompt but its last token
    head_ids = ids.new_zeros((len(first), width))
    head_mask = ids.new_zeros((len(first), width))
    for g, prompt in enumerate(first):
        head_ids[g, :len(prompt) - 1] = torch.tensor(prompt[:-1])
        head_mask[g, :len(prompt) - 1] = 1
    # Position j of a row's tail is its prompt's last token (j = 0) or completion token j - 1.
    tail_ids = ids.new_zeros((len(prompts), c_max))
    tail_mask = ids.new_zeros((len(prompts), c_max))
    for b, (p, c) in enumerate(zip(prompt_lens, completion_lens, strict=True)):
        tail_ids[b, :c] = ids[b, p - 1: p - 1 + c]
        tail_mask[b, :max(c, 1)] = 1  # an empty completion still reads its last prompt token (scored nowhere)
    tail_positions = torch.tensor(prompt_lens, device=device).unsqueeze(1) - 1 + torch.arange(c_max, device=device)
    rows = torch.tensor(index, device=device)

    head_inputs = {"input_ids": head_ids, "attention_mask": head_mask,
                   "position_ids": torch.arange(width, device=device).expand(len(first), width)}
    with precision.autocast(autocast, str(device)):  # one copy per row; the backward sums them into the prefix
        prefixes = ReplayableCache(config=model.config)
        copied_cache(model, head_inputs, rows, prefixes)  # fills it in place
        cache = prefixes.reader()
    tail_inputs = {"input_ids": tail_ids, "attention_mask": torch.cat([head_mask[rows], tail_mask], dim=1),
                   "position_ids": tail_positions, cache_kwarg(model): cache, "use_cache": True}
    scored, at = completion_positions(completion_lens, device)
    targets = ids[scored, torch.tensor(prompt_lens, device=device)[scored] + at]
    picked = selected_logprobs(model, tail_inputs, scored, at, targets, temperature, with_entropy=with_entropy,
                               autocast=autocast)
    return spread(picked, scored, at, (len(prompts), c_max))
