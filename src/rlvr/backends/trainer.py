"""The torch trainer: one policy-gradient step per call, LoRA or full fine-tune.

``TorchTrainer(rollouts, advantages, step) -> metrics`` packs the rollouts (prompt + completion,
exactly the sampled ids), computes per-token log-probs of the completion under the live policy,
broadcasts each rollout's advantage over its trainable tokens, and minimises
:func:`~rlvr.backends.losses.compute_loss`. AdamW, gradient clipping, and a non-finite guard: a
step whose loss or gradient is not finite is skipped (no update, version unchanged), counted, and
after ``max_nonfinite`` consecutive skips the run stops with a clear error.

``save(path)``/``load(path)`` hold everything a bit-for-bit resume needs: the adapter (PEFT
safetensors, loadable by vLLM) or full weights, the optimizer state, and the version.

A backend module: imports torch and peft. It never branches on the algorithm: the loss
configuration decides the math.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, load_model, save_model

from rlvr.backends.losses import LossConfig, LossInputs, compute_loss
from rlvr.backends.model_io import token_logprobs
from rlvr.backends.policy import Policy
from rlvr.errors import RLLoopError
from rlvr.types import Rollout


class TorchTrainer:
    """A policy-gradient trainer over a shared :class:`Policy`."""

    def __init__(self, policy: Policy, *, loss: LossConfig = LossConfig(), lr: float = 1e-5,
                 weight_decay: float = 0.0, max_grad_norm: float = 1.0, temperature: float = 1.0,
                 max_nonfinite: int = 3, micro_batch: int = 256):
        self.policy, self.loss, self.temperature = policy, loss, temperature
        self.max_grad_norm, self.max_nonfinite, self.micro_batch = max_grad_norm, max_nonfinite, micro_batch
        self.optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=lr, weight_decay=weight_decay)
        self.nonfinite_skips = self.consecutive_skips = 0

    @property
    def version(self) -> int:
        return self.policy.version

    def __call__(self, rollouts: Sequence[Rollout], advantages: Sequence[float], step: int) -> dict[str, float]:
        if len(rollouts) != len(advantages):
            raise RLLoopError(f"step {step}: {len(rollouts)} rollouts but {len(advantages)} advantages")
        model = self.policy.model
        model.train()
        self.optimizer.zero_grad(set_to_none=True)
        # Each micro-batch's loss is a mean over its own tokens (token-mean) or its own non-empty
        # sequences (the other modes); weighting by its share of those recovers the full-batch loss.
        unit = (lambda r: sum(r.mask)) if self.loss.aggregation == "token-mean" else (lambda r: int(any(r.mask)))
        total = sum(unit(r) for r in rollouts) or 1
        totals: dict[str, float] = {}
        for start in range(0, len(rollouts), self.micro_batch):
            chunk = slice(start, start + self.micro_batch)
            weight = sum(unit(r) for r in rollouts[chunk]) / total
            out = self._loss(rollouts[chunk], advantages[chunk])
            (out.loss * weight).backward()
            for key, value in out.metrics.items():
                totals[key] = totals.get(key, 0.0) + value * weight
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.policy.trainable_parameters(), self.max_grad_norm))
        if not math.isfinite(grad_norm) or not all(math.isfinite(v) for v in totals.values()):
            return self._skip(step, grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.consecutive_skips = 0
        self.policy.version += 1
        return {**totals, "train/grad_norm": grad_norm, "train/nonfinite_skips": self.nonfinite_skips}

    def _skip(self, step: int, grad_norm: float) -> dict[str, float]:
        self.optimizer.zero_grad(set_to_none=True)
        self.nonfinite_skips += 1
        self.consecutive_skips += 1
        if self.consecutive_skips >= self.max_nonfinite:
            raise RLLoopError(
                f"step {step}: {self.consecutive_skips} consecutive non-finite losses or gradients "
                f"(limit max_nonfinite={self.max_nonfinite}); lower the learning rate or check rewards"
            )
        # The version still advances: the loop counts steps, and a skipped step is a step.
        self.policy.version += 1
        return {"train/grad_norm": grad_norm, "train/nonfinite_skips": self.nonfinite_skips,
                "train/skipped": 1.0}

    def _loss(self, rollouts: Sequence[Rollout], advantages: Sequence[float]):
        batch = pack(rollouts, advantages, self.policy.tokenizer.pad_token_id, self.policy.device)
        entropy = None
        if self.loss.entropy_coef > 0:
            logp, entropy = completion_logprobs(self.policy.model, batch, self.temperature, with_entropy=True)
        else:
            logp = completion_logprobs(self.policy.model, batch, self.temperature)
        ref_logp = None
        if self.loss.kl_coef > 0:
            with torch.no_grad(), self.policy.as_reference() as ref:
                ref_logp = completion_logprobs(ref, batch, self.temperature)
        inputs = LossInputs(logp=logp, old_logp=None, advantages=batch["advantages"],
                            rl_weight=batch["mask"], ref_logp=ref_logp, sampler_logp=batch["sampler_logp"],
                            entropy=entropy)
        return compute_loss(inputs, self.loss)

    # ---- checkpoints ----------------------------------------------------------------------
    def save(self, path: str) -> None:
        root = Path(path)
        root.mkdir(parents=True, exist_ok=True)
        model = self.policy.model
        if self.policy.is_lora:
            model.save_pretrained(root / "adapter")
        else:
            save_model(model, str(root / "weights.safetensors"))  # handles tied embeddings
        torch.save(self.optimizer.state_dict(), root / "optimizer.pt")
        (root / "trainer.json").write_text(json.dumps(
            {"version": self.policy.version, "nonfinite_skips": self.nonfinite_skips,
             "consecutive_skips": self.consecutive_skips}))

    def load(self, path: str) -> None:
        root = Path(path)
        model = self.policy.model
        if self.policy.is_lora:
            from peft import set_peft_model_state_dict

            weights = load_file(root / "adapter" / "adapter_model.safetensors")
            set_peft_model_state_dict(model, weights)
        else:
            load_model(model, str(root / "weights.safetensors"))
        self.optimizer.load_state_dict(torch.load(root / "optimizer.pt", weights_only=True))
        state = json.loads((root / "trainer.json").read_text())
        self.policy.version = state["version"]
        self.nonfinite_skips, self.consecutive_skips = state["nonfinite_skips"], state["consecutive_skips"]

    def describe(self) -> dict[str, Any]:
        return {"type": "rlvr.backends.trainer.TorchTrainer", "lora": self.policy.is_lora,
                "loss": self.loss.policy_loss, "aggregation": self.loss.aggregation,
                "kl_coef": self.loss.kl_coef, "max_grad_norm": self.max_grad_norm}


def pack(rollouts: Sequence[Rollout], advantages: Sequence[float], pad: int, device: str) -> dict[str, Any]:
    """Right-padded prompt+completion ids and [B, C] completion-aligned tensors."""
    seqs = [list(r.prompt_ids) + list(r.completion_ids) for r in rollouts]
    width, c_max = max(map(len, seqs)), max(len(r.completion_ids) for r in rollouts) or 1
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    mask = torch.zeros((len(seqs), c_max))
    sampler_logp = torch.zeros((len(seqs), c_max))
    for b, (seq, r) in enumerate(zip(seqs, rollouts, strict=True)):
        ids[b, : len(seq)] = torch.tensor(seq)
        attn[b, : len(seq)] = 1
        n = len(r.completion_ids)
        mask[b, :n] = torch.tensor(r.mask, dtype=torch.float)
        sampler_logp[b, :n] = torch.tensor(r.logprobs, dtype=torch.float)
    adv = torch.tensor(list(advantages), dtype=torch.float).unsqueeze(1) * mask
    return {"ids": ids.to(device), "attn": attn.to(device), "mask": mask.to(device),
            "advantages": adv.to(device), "sampler_logp": sampler_logp.to(device),
            "prompt_lens": [len(r.prompt_ids) for r in rollouts],
            "completion_lens": [len(r.completion_ids) for r in rollouts], "c_max": c_max}


def completion_logprobs(model: torch.nn.Module, batch: dict[str, Any], temperature: float,
                        with_entropy: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """[B, C]: log-prob of each completion token under ``model`` (zeros past each completion),
    and with ``with_entropy`` the entropy of the distribution each token was drawn from."""
    full = token_logprobs(model, batch["ids"], batch["attn"], temperature=temperature, with_entropy=with_entropy)
    per_position = full if with_entropy else (full,)
    aligned = tuple(_completion_part(t, batch) for t in per_position)
    return aligned if with_entropy else aligned[0]


def _completion_part(per_position: torch.Tensor, batch: dict[str, Any]) -> torch.Tensor:
    """Slice the [B, T-1] next-token values of each row's completion into a [B, C] tensor."""
    pad = per_position.new_zeros((per_position.shape[0], batch["c_max"]))
    rows = []
    for b, (p, n) in enumerate(zip(batch["prompt_lens"], batch["completion_lens"], strict=True)):
        rows.append(torch.cat([per_position[b, p - 1: p - 1 + n], pad[b, n:]]))
    return torch.stack(rows)
