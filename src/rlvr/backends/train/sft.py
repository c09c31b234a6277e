"""Supervised warm start: teach a policy the answer format before RL.

RL only learns from groups whose rewards differ, so a policy that is never right gets no signal.
:func:`sft_warm_start` trains on ``(prompt, answer)`` rows with masked NLL on the answer tokens
and eos only, so the policy learns what to say (and to stop) without being trained to predict the
prompt. The prompt is rendered by :func:`rlvr.backends.model.io.render_prompt_ids`, the same
rendering rollouts use, so the warm start and RL see identical prompt tokens.
:func:`greedy_accuracy` is the quick dev-set check for stopping the warm start once the policy is
right *sometimes*, which is where RL has the most to add.

Deterministic from ``seed``: batch order comes from a private ``random.Random`` and torch is
seeded with ``torch.manual_seed(seed)`` before training.

A backend module: imports torch; the core never imports it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from rlvr.backends.model.io import render_prompt_ids, token_logprobs
from rlvr.backends.train.losses import masked_nll


def sft_warm_start(
    model,
    tokenizer,
    rows: Sequence[Mapping[str, Any]],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    weight_decay: float = 0.0,
    max_grad_norm: float | None = 1.0,
    stop_when: Callable[[], bool] | None = None,
    check_every: int = 10,
    template_kwargs: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Train ``model`` in place for up to ``steps`` AdamW steps on ``rows``; return metrics.

    Each row has ``prompt`` (a string, sent as one user turn, or a list of chat messages) and
    ``answer`` (the target reply text). Batches of ``batch_size`` rows are drawn without
    replacement, reshuffling once every row has been seen. Only parameters with
    ``requires_grad`` are optimised, so a PEFT-wrapped model trains just its adapter.

    ``stop_when``: called every ``check_every`` steps (model in eval mode); training stops when it
    returns True. A small model's accuracy jumps within a few dozen steps at a point that varies
    with the seed, so "train until a dev set is right 30% of the time" (see
    :func:`greedy_accuracy`) lands a warm start far more reliably than a fixed step count.
    ``template_kwargs``: the chat template variables prompts are rendered with (the run's own).

    Returns ``loss`` (last step), ``loss_start`` (first step), ``steps`` (taken),
    ``stopped_early``, ``seconds`` (training only, not ``stop_when``) and ``examples``.
    """
    _check_inputs(tokenizer, rows, steps, batch_size)
    torch.manual_seed(seed)
    examples = [encode_example(tokenizer, row, index=i, template_kwargs=template_kwargs) for i, row in enumerate(rows)]
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    batches = _batch_indices(len(examples), batch_size, random.Random(seed))
    was_training = model.training
    model.train()
    losses: list[float] = []
    seconds, stopped_early = 0.0, False
    try:
        for step in range(1, steps + 1):
            started = time.perf_counter()
            batch = pad_right([examples[i] for i in next(batches)], tokenizer.pad_token_id)
            losses.append(_train_step(model, optimizer, params, batch, max_grad_norm))
            seconds += time.perf_counter() - started
            if stop_when is not None and step % check_every == 0 and step < steps:
                model.eval()
                stopped_early = bool(stop_when())
                model.train()
                if stopped_early:
                    break
    finally:
        model.train(was_training)
    return {
        "loss": losses[-1] if losses else None,
        "loss_start": losses[0] if losses else None,
        "steps": len(losses),
        "stopped_early": stopped_early,
        "seconds": seconds,
        "examples": len(examples),
    }


def _check_inputs(tokenizer, rows: Sequence[Mapping[str, Any]], steps: int, batch_size: int) -> None:
    if steps < 0 or batch_size < 1:
        raise ValueError(f"sft_warm_start: need steps >= 0 and batch_size >= 1, got {steps}, {batch_size}")
    if not rows:
        raise ValueError("sft_warm_start: rows is empty; pass at least one (prompt, answer) row")
    if tokenizer.eos_token_id is None or tokenizer.pad_token_id is None:
        raise ValueError("sft_warm_start: tokenizer needs eos and pad tokens (use backends.model.io.load_tokenizer)")


def _train_step(model, optimizer, params, batch: tuple[Tensor, Tensor, Tensor], max_grad_norm) -> float:
    device = next(model.parameters()).device
    ids, attention, loss_mask = (t.to(device) for t in batch)
    logp = token_logprobs(model, ids, attention)
    # logp[:, t-1] scores token t, so the mask shifts by one to line up with it.
    loss = masked_nll(logp, loss_mask[:, 1:])
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    optimizer.step()
    return float(loss.detach())


def encode_example(tokenizer, row: Mapping[str, Any], *, index: int = 0,
                   template_kwargs: Mapping[str, Any] | None = None) -> tuple[list[int], list[int]]:
    """``(token_ids, loss_mask)`` for one row: rendered prompt (with ``template_kwargs``), then answer
    tokens and eos.

    The mask is 1 on the answer and eos tokens, 0 on the prompt.
    """
    if "prompt" not in row or "answer" not in row:
        raise ValueError(f"sft_warm_start: row {index} needs 'prompt' and 'answer' fields, has {sorted(row)}")
    prompt_ids = render_prompt_ids(tokenizer, _as_messages(row["prompt"]), template_kwargs=template_kwargs)
    answer_ids = list(tokenizer(str(row["answer"]), add_special_tokens=False)["input_ids"])
    completion = answer_ids + [tokenizer.eos_token_id]
    return prompt_ids + completion, [0] * len(prompt_ids) + [1] * len(completion)


def pad_right(batch: Sequence[tuple[list[int], list[int]]], pad_id: int) -> tuple[Tensor, Tensor, Tensor]:
    """Right-pad ``(ids, mask)`` pairs to ``[B, T]`` tensors: ids, attention mask, loss mask."""
    width = max(len(ids) for ids, _ in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    loss_mask = torch.zeros((len(batch), width), dtype=torch.float32)
    for b, (row_ids, row_mask) in enumerate(batch):
        n = len(row_ids)
        ids[b, :n] = torch.tensor(row_ids)
        attention[b, :n] = 1
        loss_mask[b, :n] = torch.tensor(row_mask, dtype=torch.float32)
    return ids, attention, loss_mask


def _batch_indices(n: int, batch_size: int, rng: random.Random):
    """Endless batches of row indices: shuffled epochs, a batch may span two epochs."""
    order: list[int] = []
    while True:
        while len(order) < batch_size:
            epoch = list(range(n))
            rng.shuffle(epoch)
            order.extend(epoch)
        yield order[:batch_size]
        del order[:batch_size]


@torch.no_grad()
def greedy_accuracy(
    model,
    tokenizer,
    rows: Sequence[Mapping[str, Any]],
    reward_fn: Callable[[list[dict[str, Any]], Any], float],
    *,
    max_new_tokens: int = 8,
    batch_size: int = 256,
    template_kwargs: Mapping[str, Any] | None = None,
) -> float:
    """Mean ``reward_fn`` of greedy replies to ``rows`` (prompt strings sent as one user turn).

    Prompts are left-padded so every reply starts at the same column; the model's train/eval
    mode is restored afterwards. A quick dev-set check for ``stop_when``, not the evaluator.
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    total = 0.0
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        messages = [_as_messages(row["prompt"]) for row in chunk]
        prompts = [render_prompt_ids(tokenizer, m, template_kwargs=template_kwargs) for m in messages]
        ids, attention = _pad_left(prompts, tokenizer.pad_token_id)
        out = model.generate(
            input_ids=ids.to(device),
            attention_mask=attention.to(device),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        for row, convo, reply_ids in zip(chunk, messages, out[:, ids.shape[1] :], strict=True):
            reply = tokenizer.decode(reply_ids, skip_special_tokens=True)
            total += reward_fn([*convo, {"role": "assistant", "content": reply}], row["answer"])
    model.train(was_training)
    return total / max(len(rows), 1)


def _as_messages(prompt: str | Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [dict(message) for message in prompt]


def _pad_left(prompts: Sequence[list[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(prompts), width), dtype=torch.long)
    for b, prompt in enumerate(prompts):
        ids[b, width - len(prompt) :] = torch.tensor(prompt)
        attention[b, width - len(prompt) :] = 1
    return ids, attention
