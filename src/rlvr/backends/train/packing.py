"""Padding-free log-probs of a packed train batch: a micro-batch's sequences in one row, no padding.

:func:`packed_completion_logprobs` takes the right-padded batch :func:`~rlvr.backends.train.trainer.pack`
builds and returns the same [B, C] completion log-probs as
:func:`~rlvr.backends.train.trainer.completion_logprobs`, but the model reads the sequences
concatenated into a single row of their real tokens, with position ids restarting at 0 for each
sequence and no attention mask: transformers then builds a block-diagonal causal mask from the
position ids (``masking_utils.find_packed_sequence_indices``), so no token attends across a
sequence boundary. The output head and the log-softmax run only on the positions that predict a
completion token (not on prompts, nor on padding, which no longer exists).

What it trades: no matmul is spent on padding, but attention runs over one row of all the
micro-batch's tokens (its cost grows with the square of the row; CPU kernels do not skip the
masked blocks), so it pays when sequences vary widely in length and micro-batches are small.

Invariant: equal to the padded path within float32 rounding (the test checks 1e-5, gradients too).

A backend module: imports torch.
"""

from __future__ import annotations

from typing import Any

import torch

from rlvr.backends.model import precision
from rlvr.backends.model.io import chosen_logprobs


def packed_completion_logprobs(model: Any, batch: dict[str, Any], temperature: float, *,
                               with_entropy: bool = False, autocast: str = "none"):
    """[B, C] completion log-probs of ``batch`` (zeros past each completion), read from one packed row;
    with ``with_entropy`` also each scored position's entropy."""
    lengths = batch["attn"].sum(dim=1).tolist()
    ids = torch.cat([row[:n] for row, n in zip(batch["ids"], lengths, strict=True)]).unsqueeze(0)
    positions = torch.cat([torch.arange(n, device=ids.device) for n in lengths]).unsqueeze(0)
    # Flat index of the position that predicts each completion token, and where it lands in [B, C].
    starts = [0]
    for n in lengths[:-1]:
        starts.append(starts[-1] + n)
    predict, rows, cols = [], [], []
    for b, (start, p, c) in enumerate(zip(starts, batch["prompt_lens"], batch["completion_lens"], strict=True)):
        predict.extend(range(start + p - 1, start + p - 1 + c))
        rows.extend([b] * c)
        cols.extend(range(c))
    at = torch.tensor(predict, dtype=torch.long, device=ids.device)
    targets = ids[0, at + 1].unsqueeze(0)
    inputs = {"input_ids": ids, "position_ids": positions, "attention_mask": None, "use_cache": False}
    logits = precision.head_logits(model, inputs, autocast, lambda hidden: hidden[:, at])
    if logits is None:
        with precision.autocast(autocast, str(ids.device)):
            logits = model(**inputs).logits[:, at]
    picked = chosen_logprobs(logits, targets, temperature, with_entropy=with_entropy)
    shape = (len(lengths), batch["c_max"])
    index = (torch.tensor(rows, dtype=torch.long), torch.tensor(cols, dtype=torch.long))

    def spread(values: torch.Tensor) -> torch.Tensor:
        return values.new_zeros(shape).index_put(index, values[0])

    return (spread(picked[0]), spread(picked[1])) if with_entropy else spread(picked)
