"""The one place that loads models and tokenizers and turns messages into token ids.

Hub names and local folders (including the tiny model from :mod:`rlvr.backends.model.tiny`) go through
the same ``from_pretrained`` calls, so nothing downstream knows which it got. Invariants kept here:
a loaded tokenizer always has a pad token; prompts are rendered to text once and tokenized once;
:func:`token_logprobs` is the single definition of "log-prob of a token under the policy", used by
both the trainer and anything that scores sequences.

A backend module: imports torch and transformers at the top; the core never imports it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlvr.backends.model import precision
from rlvr.backends.train.losses import entropy_from_logits

LOGSOFTMAX_BUDGET = 1 << 25  # float32 elements (128 MiB) of log-softmax per chunk
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_tokenizer(name_or_path: str, **from_pretrained_kwargs: Any):
    """Load a tokenizer; when it has no pad token, use eos (or unk) as pad.

    Many base models ship without a pad token; padding is only ever masked out, so reusing eos
    is safe and keeps the vocabulary (and the embedding matrix) unchanged.
    """
    tokenizer = AutoTokenizer.from_pretrained(name_or_path, **from_pretrained_kwargs)
    if tokenizer.pad_token is None:
        fallback = tokenizer.eos_token or tokenizer.unk_token
        if fallback is None:
            raise ValueError(
                f"tokenizer {name_or_path!r} has no pad, eos or unk token to pad with; "
                "set tokenizer.pad_token before training"
            )
        tokenizer.pad_token = fallback
    return tokenizer


def load_model(
    name_or_path: str,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    **from_pretrained_kwargs: Any,
):
    """Load a causal LM in ``dtype`` ("float32", "bfloat16", "float16") onto ``device``.

    Returns the model in eval mode; trainers switch it to train mode themselves. When the
    generation config has no pad token id, the first eos id stands in (see :func:`load_tokenizer`).
    """
    if dtype not in _DTYPES:
        raise ValueError(f"load_model: dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    model = AutoModelForCausalLM.from_pretrained(
        name_or_path, dtype=_DTYPES[dtype], **from_pretrained_kwargs
    )
    model.to(device)
    model.eval()
    generation = model.generation_config
    if generation.pad_token_id is None and generation.eos_token_id is not None:
        eos = generation.eos_token_id
        generation.pad_token_id = eos[0] if isinstance(eos, (list, tuple)) else eos
    return model


def takes_logits_to_keep(model) -> bool:
    """Whether ``model``'s forward can run its output head on the last positions only."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return _forward_takes_logits_to_keep(type(inner))


@functools.cache
def _forward_takes_logits_to_keep(cls: type) -> bool:  # once per model class, not per micro-batch
    return "logits_to_keep" in inspect.signature(cls.forward).parameters


def render_prompt_ids(tokenizer, messages: Sequence[Mapping[str, Any]],
                      tools: Sequence[Mapping[str, Any]] | None = None,
                      template_kwargs: Mapping[str, Any] | None = None) -> list[int]:
    """Token ids of ``messages`` followed by the prompt for the assistant's next turn.

    With a chat template: rendered with ``add_generation_prompt=True`` to one string, then
    tokenized once without adding special tokens (the template already places bos and role
    markers; adding them again would double bos).
    Without a chat template (plain base models): the message contents are concatenated with no
    separator and no role markers, and tokenized with the tokenizer's own special tokens. That
    keeps a single-turn prompt such as "37+45=" exactly as written.
    ``tools`` (OpenAI function schemas) go to the chat template, which renders them as it was taught;
    ``template_kwargs`` are extra template variables (``enable_thinking=False``).
    """
    if getattr(tokenizer, "chat_template", None):
        extra = {**(template_kwargs or {}), **({"tools": list(tools)} if tools else {})}
        text = tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=True, **extra
        )
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    text = "".join(str(message.get("content") or "") for message in messages)
    return list(tokenizer(text)["input_ids"])


def token_logprobs(
    model, input_ids: Tensor, attention_mask: Tensor, *, temperature: float = 1.0,
    with_entropy: bool = False, skip: int = 0, autocast: str = "none",
) -> Tensor | tuple[Tensor, Tensor]:
    """``out[b, t-1-skip] = log p(input_ids[b, t] | input_ids[b, :t])`` for t > skip, shape [B, T-1-skip].

    ``p`` is the softmax of ``logits / temperature``: the distribution a sampler at that
    temperature draws from, so these match its behaviour log-probs. ``temperature=0`` means greedy
    decoding and scores with the plain logits, as the sampler does.
    Log-softmax is taken in float32 whatever the model dtype. Position ids follow the attention
    mask (the first real token is position 0), so left- and right-padded batches give the same
    log-probs for the same tokens, matching what ``generate`` sees. Entries whose target token is
    padding (``attention_mask[:, t] == 0``) are 0. Gradients flow when the caller has them enabled.

    ``with_entropy=True`` also returns the entropy of each position's (tempered) next-token
    distribution, [B, T-1], with gradient, for an entropy bonus.

    ``skip`` leaves out the first ``skip`` targets (a batch's shortest prompt, whose tokens are never
    scored): the output head then runs on the remaining positions only, which for a large vocabulary
    and a long prompt is most of the logits' time and memory.

    ``autocast="bfloat16"`` runs the transformer body under bf16 autocast and the output head in
    float32 (:mod:`~rlvr.backends.model.precision`): master weights and gradients stay float32.

    Memory: beyond the model's own [B, T - skip, V] logits, at most ``LOGSOFTMAX_BUDGET`` float32
    values of log-softmax exist at a time.
    """
    if temperature < 0:
        raise ValueError(f"token_logprobs: temperature must be >= 0, got {temperature}")
    T = input_ids.shape[1]
    if skip < 0 or (skip and skip > T - 2):
        raise ValueError(f"token_logprobs: skip must be in [0, {T - 2}] for {T} positions, got {skip}")
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids,
              "use_cache": False}
    logits = None
    if autocast != "none":
        logits = precision.head_logits(model, inputs, autocast, lambda hidden: hidden[:, skip:-1])
    if logits is None:
        keep = {"logits_to_keep": T - skip} if skip and takes_logits_to_keep(model) else {}
        with precision.autocast(autocast, str(input_ids.device)):
            logits = model(**inputs, **keep).logits
        logits = logits[:, skip - T:-1] if skip else logits[:, :-1]  # a model without logits_to_keep: cut here
    targets = input_ids[:, 1 + skip:]
    picked = chosen_logprobs(logits, targets, temperature, with_entropy=with_entropy)
    keep = attention_mask[:, 1 + skip:].bool()
    # where, not multiply: a -inf at a padded position times 0 would be nan.
    if not with_entropy:
        return torch.where(keep, picked, 0.0)
    return torch.where(keep, picked[0], 0.0), torch.where(keep, picked[1], 0.0)


def chosen_logprobs(logits: Tensor, targets: Tensor, temperature: float, *,
                    with_entropy: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """``log softmax(logits / temperature)[..., target]`` for [B, T, V] logits and [B, T] targets,
    as ``logit - logsumexp`` in float32, in chunks of positions: no [B, T, V] float32 log-softmax
    is ever built (a bf16 model's logits would double in memory), at most ``LOGSOFTMAX_BUDGET``
    values of a float32 copy at a time. With ``with_entropy`` also each position's entropy."""
    scale = temperature if temperature > 0 else 1.0
    B, T, V = logits.shape
    flat, flat_targets = logits.reshape(B * T, V), targets.reshape(B * T, 1)
    chunk = max(1, LOGSOFTMAX_BUDGET // max(1, V))
    picked, entropies = [], []
    for start in range(0, B * T, chunk):
        part = flat[start:start + chunk].float()
        part = part / scale if scale != 1.0 else part  # no copy of the chunk's logits when nothing scales
        chosen = part.gather(-1, flat_targets[start:start + chunk]).squeeze(-1)
        picked.append(chosen - torch.logsumexp(part, dim=-1))
        if with_entropy:
            entropies.append(entropy_from_logits(part))
    logp = torch.cat(picked).reshape(B, T)
    return (logp, torch.cat(entropies).reshape(B, T)) if with_entropy else logp
