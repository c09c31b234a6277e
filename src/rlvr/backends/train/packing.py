"""Padding-free log-probs of a packed train batch: a micro-batch's sequences in one row, no padding.

:func:`packed_completion_logprobs` takes the right-padded batch :func:`~rlvr.backends.train.trainer.pack`
builds and returns the same [B, C] completion log-probs as
:func:`~rlvr.backends.train.trainer.completion_logprobs`, but the model reads the sequences
concatenated into a single row of their real tokens, with position ids restarting at 0 for each
sequence and no attention mask: transformers then builds a block-diagonal causal mask from the
position ids (``masking_utils.find_packed_sequence_indices``), so no token attends across a
sequence boundary. The output head and the log-softmax run only on the positions that predict a
completion token (not on prompts, nor on padding, which no longer exists), in chunks
(:func:`~rlvr.backends.model.io.selected_logprobs`).

What it trades: no matmul is spent on padding, but attention runs over one row of all the
micro-batch's tokens (its cost grows with the square of the row; CPU kernels do not skip the
masked blocks), so it pays when sequences vary widely in length and micro-batches are small.

Invariant: equal to the padded path within float32 rounding (the test checks 1e-5, gradients too).

A backend module: imports torch.
"""

from __future__ import annotations

from typing import Any

import torch

from rlvr.backends.model.io import completion_positions, selected_logprobs, spread


def packed_completion_logprobs(model: Any, batch: dict[str, Any], temperature: float, *,
                               with_entropy: bool = False, autocast: str = "none"):
    """[B, C] completion log-probs of ``batch`` (zeros past each completion), read from one packed row;
    with ``with_entropy`` also each scored position's entropy."""
    lengths = batch["attn"].sum(dim=1).tolist()
    ids = torch.cat([row[:n] for row, n in zip(batch["ids"], lengths, strict=True)]).unsqueeze(0)
    positions = torch.cat([torch.arange(n, device=ids.device) for n in lengths]).unsqueeze(0)
    # Index in the packed row of the position that predicts each completion token.
    starts = torch.tensor([0, *lengths[:-1]], device=ids.device).cumsum(0)
    rows, index = completion_positions(batch["completion_lens"], ids.device)
    at = starts[rows] + torch.tensor(batch["prompt_lens"], device=ids.device)[rows] - 1 + index
    inputs = {"input_ids": ids, "position_ids": positions, "attention_mask": None, "use_cache": False}
    picked = selected_logprobs(model, inputs, torch.zeros_like(at), at, ids[0, at + 1], temperature,
                               with_entropy=with_entropy, autocast=autocast)
    return spread(picked, rows, index, (len(lengths), batch["c_max"]))
