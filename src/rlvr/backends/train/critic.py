"""PPO's critic: a value head on the policy's body, trained beside the policy by :class:`CriticTrainer`.

What it is: :class:`CriticTrainer`, a :class:`~rlvr.backends.train.trainer.TorchTrainer` that turns the
``token_rewards`` streams of a batch (``loop.advantage = 'gae'``: the reward on each rollout's last
trained token) into per-token advantages with a learned value function, and trains that function.
The value head is one linear layer (hidden size → 1, float32, zero-initialised) on the last hidden
state of the policy's decoder body: the hidden state at the position that predicts a completion
token gives V of the state that token is drawn from, as the logits there give its log-prob.

One forward, no second model: the hidden states are taken by a forward hook on the body during
the very forward that computes the log-probs (:class:`HiddenCapture`), in each of the trainer's
layouts (padded, packed, shared prompts), so the output-head code is not touched.

Each call: one no-grad forward per micro-batch takes the old values (and the old log-probs PPO's
later minibatches need); GAE with ``gamma``/``lam`` over the completion positions (prompt and
padding never enter; tokens the environment added are carried through, :func:`~rlvr.backends.train.losses.value.gae`)
gives advantages, whitened over every critic token of the batch, and returns (advantages + old
values, before whitening). Every optimizer step then adds verl's clipped value loss
(:func:`~rlvr.backends.train.losses.value.value_loss`, ``value_clip``) to the policy loss: the head
learns from all of it, the body (the LoRA adapter or the full weights) from ``vf_coef`` times it.
The head has its own AdamW (``lr``) and its own gradient clipping at ``max_grad_norm``.

Warm-up: for the first ``warmup_steps`` calls the actor does not move: the body runs without
gradient, no policy loss is backpropagated and the actor's optimizer is never stepped; only the
head learns. The version still advances once per call (a step is a step).

Metrics: ``loss/value``, ``critic/value_clip_frac``, ``critic/vpred_mean`` (per optimizer step),
``critic/explained_variance`` (of the old values against the returns), ``critic/returns_mean``,
``critic/values_mean``, ``critic/grad_norm`` and ``critic/warmup`` (1 during warm-up).
Checkpoints hold ``critic/value_head.safetensors`` and ``critic/optimizer.pt`` beside the policy's.

A backend module: imports torch and safetensors. It never branches on the algorithm: rows with
token rewards get a critic, the others train as they came.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from rlvr.backends.train.chunk import Chunk
from rlvr.backends.train.losses import LossOutput
from rlvr.backends.train.losses.value import explained_variance, gae, masked_whiten, value_loss
from rlvr.backends.train.trainer import TorchTrainer
from rlvr.errors import BackendError
from rlvr.types import Batch, Rollout

CRITIC_DIR = "critic"


@dataclass(frozen=True, slots=True)
class CriticConfig:
    """The critic's settings (``[critic]``; defaults are verl's where verl has one)."""

    gamma: float = 1.0  # discount over token positions
    lam: float = 1.0  # GAE's λ
    value_clip: float = 0.5  # verl critic.cliprange_value
    lr: float = 1e-3  # the value head's AdamW learning rate
    warmup_steps: int = 0  # calls in which only the critic learns (verl trainer.critic_warmup)
    vf_coef: float = 0.1  # the share of the value loss's gradient that reaches the policy's body

    def __post_init__(self) -> None:
        for name, low, high in (("gamma", 0.0, 1.0), ("lam", 0.0, 1.0), ("vf_coef", 0.0, 1.0)):
            value = getattr(self, name)
            if not (math.isfinite(value) and low <= value <= high):
                raise ValueError(f"critic.{name} = {value!r}: must be within [{low}, {high}]")
        if not (math.isfinite(self.value_clip) and self.value_clip > 0):
            raise ValueError(f"critic.value_clip = {self.value_clip!r}: must be a finite number > 0")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"critic.lr = {self.lr!r}: must be a finite number > 0")
        if self.warmup_steps < 0:
            raise ValueError(f"critic.warmup_steps = {self.warmup_steps}: must be >= 0")


def decoder_body(model: Any) -> torch.nn.Module:
    """The decoder body whose last hidden state the value head reads (inside a PEFT wrapper too)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    get = getattr(inner, "get_decoder", None)
    body = get() if get is not None else None
    if body is None or body is inner:
        raise BackendError(f"the critic reads the hidden states of the policy's decoder body, and "
                           f"{type(inner).__name__} has no separate one (get_decoder); use another "
                           "loop.advantage with this model")
    return body


class HiddenCapture:
    """The last call of a module while it is captured: its output's last hidden state and whether it
    was given a KV cache (the shared-prompt layout's completion pass is)."""

    def __init__(self) -> None:
        self.hidden: torch.Tensor | None = None
        self.with_cache = False

    def hook(self, module: Any, args: Any, kwargs: dict[str, Any], output: Any) -> None:
        self.hidden = output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0]
        self.with_cache = kwargs.get("cache", kwargs.get("past_key_values")) is not None


@contextmanager
def captured(body: torch.nn.Module) -> Iterator[HiddenCapture]:
    capture = HiddenCapture()
    handle = body.register_forward_hook(capture.hook, with_kwargs=True)
    try:
        yield capture
    finally:
        handle.remove()


def completion_hidden(capture: HiddenCapture, batch: dict[str, Any], packed: bool) -> tuple[torch.Tensor, ...]:
    """(hidden [N, H], rows, index): the hidden state at the position predicting each completion token,
    row ``rows[n]`` and token ``index[n]`` of the batch, in the layout the forward used."""
    hidden = capture.hidden
    if hidden is None:
        raise BackendError("the critic saw no forward of the policy's body")
    device = hidden.device
    lens = torch.tensor(batch["completion_lens"], dtype=torch.long, device=device)
    rows = torch.repeat_interleave(torch.arange(len(lens), device=device), lens)
    index = torch.arange(rows.numel(), device=device) - (torch.cumsum(lens, 0) - lens)[rows]
    prompt = torch.tensor(batch["prompt_lens"], dtype=torch.long, device=device)[rows]
    if packed:  # one row of every sequence's real tokens, back to back
        lengths = batch["attn"].sum(dim=1).to(device)
        starts = torch.cumsum(lengths, 0) - lengths
        return hidden[0, starts[rows] + prompt - 1 + index], rows, index
    if capture.with_cache:  # the shared prompts' second pass: position j predicts completion token j
        return hidden[rows, index], rows, index
    return hidden[rows, prompt - 1 + index], rows, index


class ValueHead(torch.nn.Module):
    """V(state) = w·h + b on the body's last hidden state; zero at the start (every value 0)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.linear.weight)
        torch.nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.linear(hidden.float()).squeeze(-1)


class CriticTrainer(TorchTrainer):
    """The torch trainer with a value head on the policy's body (see the module docstring)."""

    has_critic = True

    def __init__(self, policy: Any, *, critic: CriticConfig = CriticConfig(), **kwargs: Any):
        super().__init__(policy, **kwargs)
        self.critic = critic
        self.body = decoder_body(policy.model)
        inner = policy.model.get_base_model() if hasattr(policy.model, "get_base_model") else policy.model
        self.value_head = ValueHead(int(inner.config.hidden_size)).to(policy.device)
        self.critic_optimizer = torch.optim.AdamW(self.value_head.parameters(), lr=critic.lr)
        self._values: torch.Tensor | None = None  # the live critic's values of the chunk in the loss
        self._batch_metrics: dict[str, float] = {}

    @property
    def warming_up(self) -> bool:
        """This call trains the critic alone (the policy has taken fewer than ``warmup_steps`` steps)."""
        return self.policy.version < self.critic.warmup_steps

    def __call__(self, batch: Batch) -> dict[str, float]:
        metrics = super().__call__(batch)
        return {**metrics, **self._batch_metrics}

    def _chunks(self, rollouts: Sequence[Rollout]) -> list[Chunk]:
        chunks = super()._chunks(rollouts)
        units = sum(1 for r in rollouts if r.token_rewards is not None for m in r.mask if m)
        for chunk in chunks:  # the value loss is a token-mean over the whole minibatch's critic tokens
            chunk.batch["critic_units"] = float(max(units, 1))
        return chunks

    # ---- one forward: log-probs and values ------------------------------------------------------
    def _policy_logprobs(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor | None]:
        warm = self.warming_up
        with captured(self.body) as capture, torch.set_grad_enabled(torch.is_grad_enabled() and not warm):
            logp, entropy = super()._policy_logprobs(batch)
        self._values = self._values_of(capture, batch, body_share=0.0 if warm else self.critic.vf_coef)
        return logp, entropy

    def _values_of(self, capture: HiddenCapture, batch: dict[str, Any], body_share: float) -> torch.Tensor:
        """[B, C] values of the captured forward (0 past each completion); the body gets ``body_share``
        of their gradient, the head all of it."""
        hidden, rows, index = completion_hidden(capture, batch, self.packing)
        if body_share == 0.0:
            hidden = hidden.detach()
        elif body_share != 1.0:
            hidden = hidden * body_share + hidden.detach() * (1.0 - body_share)
        with torch.autocast(device_type=hidden.device.type, enabled=False):
            values = self.value_head(hidden)
        shape = (len(batch["completion_lens"]), batch["c_max"])
        return values.new_zeros(shape).index_put((rows, index), values)

    def _snapshot(self, minibatches: list[list[Chunk]]) -> None:
        """Old log-probs (where the base trainer takes them) and old values in one forward per micro-batch,
        then GAE over the batch."""
        with torch.no_grad():
            for k, chunks in enumerate(minibatches):
                for chunk in chunks:
                    batch = chunk.batch
                    with captured(self.body) as capture:
                        logp = self._logprobs(self.policy.model, batch)
                    batch["old_values"] = self._values_of(capture, batch, body_share=0.0)
                    if k or self.update_epochs > 1:
                        chunk.keep_old_logp(logp, first_minibatch=k == 0)
        self._batch_metrics = self._estimate([c.batch for chunks in minibatches for c in chunks])

    def _estimate(self, batches: list[dict[str, Any]]) -> dict[str, float]:
        """GAE advantages (whitened over every critic token of the call) and returns into each batch."""
        raw = []
        for batch in batches:
            mask, rewards = batch["critic_mask"], batch["token_rewards"]
            if rewards is None:
                rewards = torch.zeros_like(mask)
            advantages, batch["returns"] = gae(rewards, batch["old_values"], mask, self.critic.gamma, self.critic.lam)
            raw.append(advantages[mask.bool()])
        flat = torch.cat(raw) if raw else torch.zeros(0)
        whitened = masked_whiten(flat, torch.ones_like(flat)).tolist()
        at = 0
        for batch in batches:
            keep = batch["critic_mask"].bool()
            n = int(keep.sum())
            filled = batch["advantages"].clone()
            filled[keep] = torch.tensor(whitened[at:at + n], dtype=filled.dtype, device=filled.device)
            batch["advantages"], at = filled, at + n
        returns = torch.cat([b["returns"][b["critic_mask"].bool()] for b in batches]) if batches else flat
        values = torch.cat([b["old_values"][b["critic_mask"].bool()] for b in batches]) if batches else flat
        metrics = {"critic/returns_mean": float(returns.mean()) if returns.numel() else 0.0,
                   "critic/values_mean": float(values.mean()) if values.numel() else 0.0,
                   "critic/warmup": float(self.warming_up)}
        if returns.numel() >= 2:  # no variance to explain in fewer tokens: the metric is left out, never nan
            metrics["critic/explained_variance"] = explained_variance(returns, values, torch.ones_like(returns))
        return metrics

    # ---- the loss and the step ----------------------------------------------------------------------
    def _loss(self, batch: dict[str, Any], old_logp: torch.Tensor | None, denominators: dict[str, float]) -> Any:
        out = super()._loss(batch, old_logp, denominators)
        values, mask, units = self._values, batch["critic_mask"], batch["critic_units"]
        assert values is not None
        loss, clip_frac = value_loss(values, batch["old_values"], batch["returns"], mask, self.critic.value_clip,
                                     denominator=units)
        vpred = (torch.where(mask.bool(), values, 0.0).sum() / units).detach()
        metrics = {**out.metrics, "loss/value": float(loss.detach()), "critic/value_clip_frac": float(clip_frac),
                   "critic/vpred_mean": float(vpred)}
        total = loss if self.warming_up else out.loss + loss  # warm-up: nothing reaches the actor
        return LossOutput(loss=total, metrics=metrics)

    def _minibatch(self, chunks: list[Chunk]) -> tuple[dict[str, float] | None, float]:
        metrics, grad_norm = super()._minibatch(chunks)
        head_norm = float(torch.nn.utils.clip_grad_norm_(self.value_head.parameters(), self.max_grad_norm))
        if metrics is not None and math.isfinite(head_norm):
            self.critic_optimizer.step()
            metrics["critic/grad_norm"] = head_norm
        self.critic_optimizer.zero_grad(set_to_none=True)
        return metrics, grad_norm

    # ---- checkpoints ----------------------------------------------------------------------------
    def save(self, path: str) -> None:
        super().save(path)
        root = Path(path) / CRITIC_DIR
        root.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.value_head.state_dict().items()},
                  str(root / "value_head.safetensors"))
        torch.save(self.critic_optimizer.state_dict(), root / "optimizer.pt")

    def load(self, path: str) -> None:
        super().load(path)
        root = Path(path) / CRITIC_DIR
        if not (root / "value_head.safetensors").exists():
            raise BackendError(f"checkpoint {path} holds no critic ({CRITIC_DIR}/value_head.safetensors): it was "
                               "written by a run without one, so it cannot resume a run with loop.advantage = 'gae'")
        self.value_head.load_state_dict(load_file(str(root / "value_head.safetensors"), device=str(self.policy.device)))
        self.critic_optimizer.load_state_dict(torch.load(root / "optimizer.pt", weights_only=True))

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "type": "rlvr.backends.train.critic.CriticTrainer",
                "critic": {"value_head": "linear on the policy's body", **asdict(self.critic)}}
