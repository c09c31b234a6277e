"""The one place that loads models and tokenizers and turns messages into token ids.

Hub names and local folders (including the tiny model from :mod:`rlvr.backends.model.tiny`) go through
the same ``from_pretrained`` calls, so nothing downstream knows which it got. Invariants kept here:
a loaded tokenizer always has a pad token; prompts are rendered to text once and tokenized once;
:func:`token_logprobs` (over every position) and :func:`selected_logprobs` (over chosen positions,
the trainer's layouts) are the single definition of "log-prob of a token under the policy", used by
both the trainer and anything that scores sequences.

A backend module: imports torch and transformers at the top; the core never imports it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, overload

import torch
from torch import Tensor
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlvr.backends.model import precision
from rlvr.backends.model.head import chunk_positions, head_logprobs
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
    model: Any = AutoModelForCausalLM.from_pretrained(
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
    return "logits_to_keep" in _forward_parameters(model)


def cache_kwarg(model) -> str:
    """The keyword ``model``'s forward and ``generate`` take a KV cache by: ``cache`` where the model
    class names it (transformers 5.2x renamed ``past_key_values``, which is deprecated there and goes
    in 5.40), ``past_key_values`` otherwise."""
    return "cache" if "cache" in _forward_parameters(model) else "past_key_values"


def _forward_parameters(model) -> frozenset[str]:
    """The parameter names of ``model``'s forward, looked through a PEFT wrapper."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return _parameters_of_forward(inner.__class__)


@functools.cache
def _parameters_of_forward(cls: Any) -> frozenset[str]:  # once per model class, not per micro-batch
    return frozenset(inspect.signature(cls.forward).parameters)


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


@overload
def token_logprobs(model: Any, input_ids: Tensor, attention_mask: Tensor, *, temperature: float = ...,
                   with_entropy: Literal[False] = ..., skip: int = ..., autocast: str = ...) -> Tensor: ...
@overload
def token_logprobs(model: Any, input_ids: Tensor, attention_mask: Tensor, *, temperature: float = ...,
                   with_entropy: Literal[True], skip: int = ..., autocast: str = ...) -> tuple[Tensor, Tensor]: ...
@overload
def token_logprobs(model: Any, input_ids: Tensor, attention_mask: Tensor, *, temperature: float = ...,
                   with_entropy: bool, skip: int = ..., autocast: str = ...) -> Tensor | tuple[Tensor, Tensor]: ...
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
    scored). The output head runs only on the positions whose target is a real token past ``skip``.

    ``autocast="bfloat16"`` runs the transformer body under bf16 autocast and the output head in
    float32 (:mod:`~rlvr.backends.model.precision`): master weights and gradients stay float32.

    Memory: the head and log-softmax run in chunks of positions (:mod:`~rlvr.backends.model.head`),
    so no [B, T, V] logits exist for a model with a plain body/head split; a model run whole makes
    its own logits of the positions past ``skip``.
    """
    if temperature < 0:
        raise ValueError(f"token_logprobs: temperature must be >= 0, got {temperature}")
    T = input_ids.shape[1]
    if skip < 0 or (skip and skip > T - 2):
        raise ValueError(f"token_logprobs: skip must be in [0, {T - 2}] for {T} positions, got {skip}")
    inputs, rows, cols = scored_positions(input_ids, attention_mask, skip)
    picked = selected_logprobs(model, inputs, rows, cols, input_ids[rows, cols + 1], temperature,
                               with_entropy=with_entropy, autocast=autocast)
    return spread(picked, rows, cols - skip, (input_ids.shape[0], T - 1 - skip))


def scored_positions(input_ids: Tensor, attention_mask: Tensor, skip: int) -> tuple[dict[str, Any], Tensor, Tensor]:
    """The forward's inputs and the (row, column) of every position past ``skip`` whose next token is real."""
    rows, cols = attention_mask[:, 1 + skip:].nonzero(as_tuple=True)
    return forward_inputs(input_ids, attention_mask), rows, cols + skip


def forward_inputs(input_ids: Tensor, attention_mask: Tensor) -> dict[str, Any]:
    """A padded batch's forward arguments: position ids follow the mask (the first real token is 0), no cache."""
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids,
            "use_cache": False}


def completion_positions(completion_lens: Sequence[int], device: Any) -> tuple[Tensor, Tensor]:
    """``(rows, index)``: the row and the index within its completion of every completion token, [M] each,
    row by row (row ``b`` has ``completion_lens[b]`` tokens)."""
    lens = torch.tensor(completion_lens, dtype=torch.long, device=device)
    rows = torch.repeat_interleave(torch.arange(len(completion_lens), device=device), lens)
    starts = torch.cumsum(lens, 0) - lens
    return rows, torch.arange(rows.numel(), device=device) - starts[rows]


def spread(values: Tensor | tuple[Tensor, ...], rows: Tensor, cols: Tensor, shape: tuple[int, int]) -> Any:
    """[N] values (or a tuple of them) at (rows, cols) of a zero [B, C] tensor each (differentiable)."""
    if isinstance(values, tuple):
        return tuple(spread(v, rows, cols, shape) for v in values)
    return values.new_zeros(shape).index_put((rows, cols), values)


def selected_logprobs(model, inputs: dict[str, Any], rows: Tensor, cols: Tensor, targets: Tensor,
                      temperature: float, *, with_entropy: bool = False,
                      autocast: str = "none") -> Tensor | tuple[Tensor, Tensor]:
    """[N] log-probs of ``targets`` predicted at positions (``rows``, ``cols``) of ``model(**inputs)``
    (and with ``with_entropy`` each position's entropy), under ``softmax(logits / temperature)``.

    With a plain body/head split (:func:`~rlvr.backends.model.precision.split_head`) the body runs
    under ``autocast``, its hidden states of those positions only go to the head, and the head and
    log-softmax run in float32 chunks with their own backward (:func:`~rlvr.backends.model.head.head_logprobs`):
    no [N, V] logits. A model without one is run whole (its head under autocast too) and its logits
    scored in chunks (:func:`chosen_logprobs`), as :class:`PositionFeatures` says."""
    features = position_features(model, inputs, rows, cols, autocast)
    return features.logprobs(targets, temperature, with_entropy=with_entropy)


@dataclass(frozen=True, slots=True)
class PositionFeatures:
    """What the output head scores at chosen positions: the body's hidden states there ([N, H]) and the
    head; or, for a model run whole, its logits ([B, T', V], from the first chosen column where the
    model takes ``logits_to_keep``) and the chosen positions in them."""

    hidden: Tensor | None
    head: Any
    logits: Tensor | None
    rows: Tensor
    cols: Tensor

    def logprobs(self, targets: Tensor, temperature: float, *,
                 with_entropy: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """[N] log-probs of ``targets`` at the chosen positions (and with ``with_entropy`` their entropies)."""
        if self.logits is None:
            hidden = self._hidden()
            with torch.autocast(device_type=hidden.device.type, enabled=False):
                return head_logprobs(hidden, self.head, targets, temperature, with_entropy=with_entropy)
        # Scored in place over every position of the logits (no [N, V] copy), then the chosen ones picked.
        dense = torch.zeros(self.logits.shape[:2], dtype=torch.long, device=self.logits.device)
        dense[self.rows, self.cols] = targets
        picked = chosen_logprobs(self.logits, dense, temperature, with_entropy=with_entropy)
        if isinstance(picked, tuple):  # with_entropy
            return picked[0][self.rows, self.cols], picked[1][self.rows, self.cols]
        return picked[self.rows, self.cols]

    def _hidden(self) -> Tensor:
        assert self.hidden is not None  # exactly one of hidden and logits is set
        return self.hidden

    @torch.no_grad()
    def ranks(self, targets: Tensor) -> Tensor:
        """[N] rank of each target among its position's logits (1 = the most likely; ties count against
        the target, as vLLM counts them), in chunks of positions."""
        if self.logits is None:
            vocab, device = self.head.weight.shape[0], self._hidden().device
        else:
            vocab, device = self.logits.shape[-1], self.logits.device
        step = chunk_positions(vocab)
        ranks = [torch.zeros(0, dtype=torch.long, device=device)]
        with torch.autocast(device_type=device.type, enabled=False):
            for start in range(0, targets.shape[0], step):
                end = start + step
                if self.logits is None:
                    z = self.head(self._hidden()[start:end].to(self.head.weight.dtype)).float()
                else:
                    z = self.logits[self.rows[start:end], self.cols[start:end]].float()
                ranks.append((z >= z.gather(-1, targets[start:end].unsqueeze(-1))).sum(-1))
        return torch.cat(ranks)


def position_features(model, inputs: dict[str, Any], rows: Tensor, cols: Tensor, autocast: str) -> PositionFeatures:
    """The body's hidden states at positions (``rows``, ``cols``) and the head where the model has a plain
    body/head split, else the whole model's logits (the head only from the first column chosen onwards,
    where the model takes ``logits_to_keep``)."""
    device = str(inputs["input_ids"].device)
    parts = precision.split_head(model)
    if parts is not None:
        body, head = parts
        with precision.autocast(autocast, device):
            hidden = body(**inputs).last_hidden_state
        return PositionFeatures(hidden[rows, cols], head, None, rows, cols)
    width = inputs["input_ids"].shape[1]
    first = int(cols.min()) if cols.numel() else width - 1
    keep = {"logits_to_keep": width - first} if first and takes_logits_to_keep(model) else {}
    with precision.autocast(autocast, device):
        logits = model(**inputs, **keep).logits
    return PositionFeatures(None, None, logits, rows, cols - (width - logits.shape[1]))


def chosen_logprobs(logits: Tensor, targets: Tensor, temperature: float, *,
                    with_entropy: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """``log softmax(logits / temperature)[..., target]`` for [B, T, V] logits and [B, T] targets,
    as ``logit - logsumexp`` in float32, in chunks of positions: no [B, T, V] float32 log-softmax
    is ever built (a bf16 model's logits would double in memory), at most ``LOGSOFTMAX_BUDGET``
    values of a float32 copy at a time. With ``with_entropy`` also each position's entropy. For logits
    a model made whole; :func:`selected_logprobs` never makes them where the model has a plain head."""
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
    if not picked:  # no position at all
        empty = logits.new_zeros((B, T), dtype=torch.float32)
        return (empty, empty) if with_entropy else empty
    logp = torch.cat(picked).reshape(B, T)
    return (logp, torch.cat(entropies).reshape(B, T)) if with_entropy else logp
