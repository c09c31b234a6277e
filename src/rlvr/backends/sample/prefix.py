"""Shared prompts in a generation batch: each distinct prompt is read once, its KV cache copied per row.

A training step samples ``group_k`` completions of every prompt, so a batch of 64 rows often holds
only 8 distinct prompts. Reading a prompt (prefill) is most of a short completion's cost on a CPU:
:func:`shared_prompt_cache` runs the model once per distinct prompt over all of it but its last
token, and copies the resulting key/value cache to every row that repeats it. ``generate`` then reads
only each row's last prompt token before sampling, so the first sampled token's logits, and every
one after, are computed as without the cache (the test compares them).

Invariant: a batch with no repeated prompt, or a prompt of fewer than two tokens, gets no cache (the
caller generates as usual); the cache holds exactly ``width - 1`` columns of the left-padded batch,
with the same position ids ``generate`` gives them (from the attention mask).

A backend module: imports torch and transformers.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from rlvr.backends.model.prefill import copied_cache, distinct


def shared_prompt_cache(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> DynamicCache | None:
    """The KV cache of ``ids[:, :-1]`` (left-padded prompts, ``mask`` their attention mask) computed
    once per distinct row and copied to each row, or ``None`` when no row repeats another or a prompt
    has a single token (its row would be all padding here)."""
    rows = [tuple(row) for row in torch.cat([ids, mask], dim=1).tolist()]
    firsts, index = distinct(rows)
    if len(firsts) == len(rows) or ids.shape[1] < 2 or int(mask.sum(dim=1).min()) < 2:
        return None
    at = torch.tensor([rows.index(row) for row in firsts], device=ids.device)
    head_ids, head_mask = ids[at, :-1], mask[at, :-1]
    # generate's own rule: positions count real tokens; padding columns get 1 (their value is masked anyway)
    positions = (head_mask.long().cumsum(-1) - 1).masked_fill(head_mask == 0, 1)
    return copied_cache(model, {"input_ids": head_ids, "attention_mask": head_mask, "position_ids": positions},
                        torch.tensor(index, device=ids.device))
