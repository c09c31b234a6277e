"""The torch trainer: one batch per call, trained in K PPO minibatches, LoRA or full fine-tune.

``TorchTrainer(batch) -> metrics`` packs the batch's rollouts (prompt + completion,
exactly the sampled ids) with their credit streams (per-token advantages, ``rl`` / ``ce`` /
``ref_kl`` weights, reference log-probs: :class:`~rlvr.types.Rollout`), computes per-token
log-probs of the completion under the live policy, and minimises
:func:`~rlvr.backends.train.losses.compute_loss` with AdamW and gradient clipping. It never
knows which algorithm made the streams: rollouts of several algorithms share a batch.

PPO inner loop (``ppo_n_minibatches`` = K): the batch is cut into K contiguous minibatches (the
first ``n % K`` one rollout longer; K is capped at the number of rollouts) and each gets one
optimizer step. Before the first step the old-policy log-probs are snapshotted once, under no
grad, with the current weights, temperature and the same packing; every minibatch's loss takes
them as ``old_logp``, so later minibatches are importance-corrected (and clipped, for clipped
losses) against the policy that the batch started from. Minibatch 0 trains on the weights the
snapshot would be taken with, so it is passed on-policy (``old_logp=None``, ratio exactly 1)
and is left out of the snapshot: K = 1 costs no extra forward pass. With ``update_epochs`` = E
> 1 the K minibatches are trained E times in the same order, K·E optimizer steps, every pass
against the same snapshot (PPO's epochs over one batch; minibatch 0 is then snapshotted too, for
its passes after the first). Within a minibatch,
``micro_batch`` chunks divide each loss component by that component's count over the whole
minibatch (rl tokens, or rl sequences for the sequence aggregations; ce tokens; ref_kl tokens),
so the chunks' losses sum to the whole-minibatch loss (and, under data parallelism, the ranks'
shares of it: :mod:`~rlvr.backends.train.distributed`). With
``LossConfig.tis_cap`` the per-token loss is also weighted by min(π_old/π_sampler, cap).

Memory (docs/memory.md): the output head and log-softmax run in chunks with their own backward
(:func:`~rlvr.backends.model.io.selected_logprobs`), on the positions that predict a completion
token only. ``micro_batch = "auto"`` sizes each minibatch's micro-batches to a memory budget
(:mod:`~rlvr.backends.train.micro_batch`; the size is the ``train/micro_batch`` metric), and
``gradient_checkpointing`` recomputes each decoder layer in the backward
(:mod:`~rlvr.backends.train.checkpointing`). Neither changes the numbers beyond float rounding.
``release_freed_memory`` gives freed CPU memory back to the system at once (:mod:`~rlvr.backends.train.heap`);
unset, it is on where ``"auto"`` sizes on CPU, so the RSS follows the live tensors the sizer estimates.

Rows that cannot move the weights are not read (``skip_zero_advantage``, on by default): a rollout
whose every rl token has advantage 0 (a group whose samples all scored alike, under GRPO's group
baseline), in no ``ce`` or ``ref_kl`` component, adds exactly 0 to the loss and its gradient when
the loss is 0 at A = 0 (:attr:`~rlvr.backends.train.losses.LossConfig.zero_at_zero_advantage`: no
KL penalty, no entropy bonus, a built-in loss of that kind). Its tokens still count in each
component's normaliser, so the step is the same up to float rounding; a minibatch of such rows
only still reads one of them, so AdamW steps on its zero gradient as it would have. Per-token
statistics are then means over the rows read. Not with a critic (its value loss reads every
token) nor a token export (it records every row).

One call is one policy version: the version advances by exactly 1 per call, whatever K and E are
and whatever was skipped (the loop counts steps, and a skipped step is still a step). Every
optimizer step of a call runs at the learning rate of the step it trains: ``lr`` times the
:class:`~rlvr.lr_schedule.LRSchedule` factor at step ``version + 1`` (``train/lr``).

Non-finite guard, per optimizer step: a minibatch whose loss, metrics or gradient norm is not
finite is skipped (no update) and counted in ``nonfinite_skips``; the remaining minibatches still
train. ``consecutive_skips`` counts consecutive *calls* in which every minibatch was skipped (no
update at all); at ``max_nonfinite`` the run stops with a clear error. Counting calls rather than
steps keeps ``max_nonfinite`` meaning "batches in a row that made no progress" for any K.

Metrics are means over the minibatches that were applied: the loss components and loss
diagnostics, ``train/ppo_kl`` (mean over trained tokens of exp(d) − d − 1, d = logp − old_logp before
each update: k3 of the live policy against the snapshot, ≥ 0; exactly 0 for K = 1), ``train/ppo_clip_frac`` (the
loss's ``train/clip_frac``: tokens whose ratio left the clip range, 0 for unclipped losses),
``train/mean_kl`` (the loss's ``train/mismatch_kl``: k3 estimate of KL(π_sampler‖π_old) over
trained tokens, the sampler-trainer mismatch) and ``train/grad_norm`` (the pre-clip norm). Plus
``train/optimizer_steps`` (steps applied this call), ``train/skipped`` (minibatches skipped this
call), ``train/nonfinite_skips`` (skipped minibatches since the start), ``train/empty_minibatches``
(minibatches in which no token carries loss, not stepped: AdamW's momentum and weight decay would
move the weights on nothing) and ``train/lr``. When no minibatch is applied, only those and the
last ``train/grad_norm`` (if any was computed) are returned.

``save(path)``/``load(path)`` hold everything a bit-for-bit resume needs: the adapter (PEFT
safetensors, loadable by vLLM) or full weights, the optimizer state, the version and the
learning-rate schedule (a loaded checkpoint's schedule replaces the configured one, so the curve
a run started on continues unchanged). ``checkpoint_layout = "sharded"`` writes the weights and
optimizer state through ``torch.distributed.checkpoint`` instead, and ``load`` reads either layout
(:mod:`~rlvr.backends.train.checkpoint_io`). ``micro_batch_tokens`` caps each micro-batch's tokens
besides its rows (:func:`~rlvr.backends.train.micro_batch.cut_micro_batches`).

A backend module: imports torch and peft. It never branches on the algorithm: the loss
configuration decides the math.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from rlvr.backends.model.io import completion_positions, forward_inputs, selected_logprobs, spread
from rlvr.backends.model.policy import Policy
from rlvr.backends.model.precision import TRAIN_AUTOCAST
from rlvr.backends.train import heap
from rlvr.backends.train.checkpoint_io import (
    LAYOUTS,
    is_sharded_checkpoint,
    load_sharded,
    read_weights,
    save_sharded,
    write_checkpoint,
)
from rlvr.backends.train.checkpointing import enable_gradient_checkpointing
from rlvr.backends.train.chunk import Chunk
from rlvr.backends.train.losses import LossConfig, LossInputs, compute_loss
from rlvr.backends.train.micro_batch import (
    DEFAULT_BUDGET_FRAC,
    cut_micro_batches,
    forward_tokens,
    memory_description,
    sizer_for,
)
from rlvr.backends.train.offload import adamw
from rlvr.backends.train.packing import packed_completion_logprobs
from rlvr.backends.train.shared_prefix import shared_prompt_logprobs
from rlvr.backends.train.token_export import NO_EXPORT
from rlvr.errors import BackendError
from rlvr.lr_schedule import LRSchedule
from rlvr.rollouts.checks import check_credit
from rlvr.types import Batch, Rollout

# Loss metrics also reported under the PPO names the run record uses.
_ALIASES = {"train/ppo_clip_frac": "train/clip_frac", "train/mean_kl": "train/mismatch_kl"}
# Metrics each micro-batch gives as its part of the minibatch's value (they add up over micro-batches).
SUMMED_METRICS = ("loss/", "critic/")


class TorchTrainer:
    """A policy-gradient trainer over a shared :class:`Policy`."""

    has_critic = False  # token rewards need a critic to become advantages (backends/train/critic.py)

    def __init__(self, policy: Policy, *, loss: LossConfig = LossConfig(), lr: float = 1e-5,
                 weight_decay: float = 0.0, max_grad_norm: float = 1.0, temperature: float = 1.0,
                 max_nonfinite: int = 3, micro_batch: int | str = "auto", ppo_n_minibatches: int = 1,
                 autocast: str = "none", packing: bool = False, share_prompts: bool = True,
                 lr_schedule: LRSchedule | None = None, update_epochs: int = 1,
                 gradient_checkpointing: bool = False, memory_budget_frac: float = DEFAULT_BUDGET_FRAC,
                 memory_floor_frac: float = 0.0, release_freed_memory: bool | None = None, offload: str = "none",
                 micro_batch_tokens: int | None = None, checkpoint_layout: str = "gathered",
                 skip_zero_advantage: bool = True, log: Callable[[str], None] | None = None,
                 token_export: Any = None):
        if ppo_n_minibatches < 1:
            raise ValueError(f"ppo_n_minibatches must be >= 1, got {ppo_n_minibatches}")
        if update_epochs < 1:
            raise ValueError(f"update_epochs must be >= 1, got {update_epochs}")
        if checkpoint_layout not in LAYOUTS:
            raise ValueError(f"checkpoint_layout must be one of {LAYOUTS}, got {checkpoint_layout!r}")
        if autocast not in TRAIN_AUTOCAST:
            raise ValueError(f"autocast must be one of {TRAIN_AUTOCAST}, got {autocast!r}")
        self.autocast = autocast  # the body's forward-backward precision; weights and AdamW stay float32
        self.packing = packing  # each micro-batch read as one padding-free row (backends/train/packing.py)
        self.share_prompts = share_prompts  # a repeated prompt read once (backends/train/shared_prefix.py)
        self.policy, self.loss, self.temperature = policy, loss, temperature
        self.max_grad_norm, self.max_nonfinite, self.micro_batch = max_grad_norm, max_nonfinite, micro_batch
        self.ppo_n_minibatches, self.update_epochs = ppo_n_minibatches, update_epochs
        self.lr, self.lr_schedule = lr, lr_schedule or LRSchedule()  # the peak rate and its factor per step
        # "auto": rows sized per minibatch to a memory budget (backends/train/micro_batch.py)
        self.sizer = sizer_for(micro_batch, memory_budget_frac, memory_floor_frac, policy.device, log)
        self.micro_rows = micro_batch if isinstance(micro_batch, int) else 0  # the size last used
        self.micro_batch_tokens, self.micro_tokens = micro_batch_tokens, 0  # the token cap, the most tokens cut
        self.checkpoint_layout = checkpoint_layout  # "sharded": torch.distributed.checkpoint (checkpoint_io.py)
        self.gradient_checkpointing = gradient_checkpointing
        if gradient_checkpointing:  # every decoder layer recomputed in the backward (backends/train/checkpointing.py)
            enable_gradient_checkpointing(policy.model)
        # freed CPU memory back to the system at once, not kept in glibc's heap (backends/train/heap.py);
        # unset: on where "auto" sizes on CPU, whose estimate counts live tensors, which the RSS then follows
        if release_freed_memory is None:
            release_freed_memory = self.sizer is not None and torch.device(policy.device).type == "cpu"
        self.heap = heap.release_freed_memory() if release_freed_memory else "default"
        self.offload = offload  # where the weights' and AdamW's state live between steps (backends/train/offload.py)
        self.optimizer = adamw(policy.trainable_parameters(), lr=lr, weight_decay=weight_decay, offload=offload,
                               sharded=getattr(self, "shard", None) == "fsdp")
        self.nonfinite_skips = self.consecutive_skips = 0
        self.token_export = token_export or NO_EXPORT  # what it trains on, per token (backends/train/token_export.py)
        self.skip_zero_advantage = skip_zero_advantage  # rows that add nothing are not read (module doc)

    @property
    def version(self) -> int:
        return self.policy.version

    def __call__(self, batch: Batch) -> dict[str, float]:
        rollouts, step = batch.rollouts, batch.step
        self.policy.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        lr = self._set_lr()
        splits = _splits(len(rollouts), self.ppo_n_minibatches)
        self.micro_tokens = 0  # the largest micro-batch this call cuts (train/micro_batch_tokens)
        minibatches = [self._chunks(rollouts[s]) for s in splits]
        # A minibatch in which no token carries any loss (every completion masked, e.g. all truncated
        # under mask_truncated_completions) is not stepped: AdamW would still move the weights on its
        # momentum and weight decay. Decided from the whole minibatch, so every rank agrees.
        empty = {k for k, s in enumerate(splits)
                 if not any(component_units(rollouts[s], self.loss.rl_aggregation).values())}
        self._snapshot(minibatches)
        self.token_export.begin(step)
        sums: dict[str, float] = {}
        steps = skipped = empties = 0
        grad_norm = math.nan
        for k, chunks in self._passes(minibatches):
            self.token_export.at(k)
            if k in empty:
                empties += 1
                continue
            metrics, grad_norm = self._minibatch(chunks)
            if metrics is None:
                skipped += 1
                continue
            steps += 1
            for key, value in {**metrics, "train/grad_norm": grad_norm}.items():
                sums[key] = sums.get(key, 0.0) + value
        self.token_export.finish()
        self.nonfinite_skips += skipped
        if steps or skipped:  # a call with only empty minibatches neither fails nor makes progress
            self.consecutive_skips = 0 if steps else self.consecutive_skips + 1
        if self.consecutive_skips >= self.max_nonfinite:
            raise BackendError(
                f"step {step}: {self.consecutive_skips} consecutive batches with only non-finite losses or "
                f"gradients (limit max_nonfinite={self.max_nonfinite}); lower the learning rate or check rewards"
            )
        # The version advances once per call even when nothing was applied: a skipped step is a step.
        self.policy.version += 1
        counts = {"train/nonfinite_skips": self.nonfinite_skips, "train/skipped": float(skipped),
                  "train/empty_minibatches": float(empties),
                  "train/optimizer_steps": float(steps), "train/lr": lr,
                  "train/micro_batch": float(self.micro_rows),
                  **({"train/micro_batch_tokens": float(self.micro_tokens)} if self.micro_batch_tokens else {}),
                  **(self.sizer.last.metrics() if self.sizer is not None and self.sizer.last else {})}
        if not steps:  # a grad norm exists only if a minibatch was tried (and skipped as non-finite)
            return {**({"train/grad_norm": grad_norm} if skipped else {}), **counts}
        means = {key: value / steps for key, value in sums.items()}
        means.update({alias: means[key] for alias, key in _ALIASES.items() if key in means})
        return {**means, **counts}

    def _set_lr(self) -> float:
        """This call's learning rate (the schedule's, at the step it trains) on every parameter group."""
        lr = self.lr * self.lr_schedule.factor(self.policy.version + 1)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def _snapshot(self, minibatches: list[list[Chunk]]) -> None:
        """The old-policy log-probs, before any update: every minibatch's but the first (on-policy on
        its first pass), and with ``update_epochs`` > 1 the first's too, kept for its later passes."""
        with torch.no_grad():
            for k, chunks in enumerate(minibatches):
                if k == 0 and self.update_epochs == 1:
                    continue
                for chunk in chunks:
                    chunk.keep_old_logp(self._logprobs(self.policy.model, chunk.batch), first_minibatch=k == 0)

    def _passes(self, minibatches: list[list[Chunk]]) -> Any:
        """(index, minibatch) of each optimizer step: ``update_epochs`` passes over all of them, in order."""
        for epoch in range(self.update_epochs):
            yield from enumerate(minibatches)
            if epoch == 0:
                for chunk in minibatches[0]:
                    chunk.after_first_pass()

    def _chunks(self, rollouts: Sequence[Rollout]) -> list[Chunk]:
        """One minibatch as packed micro-batches. Each component of each micro-batch's loss is
        divided by that component's count over the whole minibatch (``denominators``), so the
        micro-batch losses sum to the minibatch loss exactly, whatever the mix of algorithms.
        ``weight`` (the micro-batch's share of rl units) averages the per-token statistics."""
        if not self.has_critic:
            refuse_token_rewards(rollouts)
        denominators = component_units(rollouts, self.loss.rl_aggregation)
        pad, device = self.policy.tokenizer.pad_token_id, self.policy.device
        read = self._read(rollouts)
        read_units = component_units(read, self.loss.rl_aggregation)["rl"]
        mine = self._share(read)
        self.micro_rows = self._micro_rows(rollouts)
        chunks = []
        for cut in self._cut(mine):
            part = mine[cut]
            self.micro_tokens = max(self.micro_tokens, forward_tokens(part, self.packing))
            share = component_units(part, self.loss.rl_aggregation)["rl"] / (read_units or 1.0)
            chunks.append(Chunk({**pack(part, pad, device), "rollouts": part}, denominators, share))
        return self._even_out(chunks, read)

    def _even_out(self, chunks: list[Chunk], read: Sequence[Rollout]) -> list[Chunk]:
        """This process's micro-batches of a minibatch whose rows ``read`` are read: as many as it cut
        (ranks that must run the same passes add filler ones: :mod:`~rlvr.backends.train.sharded`)."""
        return chunks

    def _read(self, rollouts: Sequence[Rollout]) -> Sequence[Rollout]:
        """The rollouts of a minibatch its forward-backward reads: all of them, or with
        ``skip_zero_advantage`` those that carry some loss (at least one: see the module doc)."""
        if not (self.skip_zero_advantage and self.loss.zero_at_zero_advantage) or self.has_critic \
                or self.token_export.on:
            return rollouts
        return [r for r in rollouts if carries_loss(r)] or list(rollouts[:1])

    def _cut(self, rollouts: Sequence[Rollout]) -> list[slice]:
        """A share's micro-batches: at most ``micro_rows`` rows and ``micro_batch_tokens`` tokens each."""
        return cut_micro_batches(rollouts, self.micro_rows, self.micro_batch_tokens, self.packing)

    def _minibatch(self, chunks: list[Chunk]) -> tuple[dict[str, float] | None, float]:
        """One optimizer step over ``chunks``: (loss metrics, grad norm), or (None, grad norm) when
        the step was non-finite and skipped. ``loss/*`` values add up over the chunks (each is its
        part of the minibatch's loss); per-token statistics are averaged by rl share."""
        totals: dict[str, float] = {}
        for chunk in chunks:
            out = self._loss(chunk.batch, chunk.old_logp, chunk.denominators)
            if chunk.filler:  # a sharded rank's stand-in pass: it joins the collectives, adds nothing
                (out.loss * 0.0).backward()
                continue
            out.loss.backward()
            for key, value in out.metrics.items():
                share = 1.0 if key.startswith(SUMMED_METRICS) else chunk.weight
                totals[key] = totals.get(key, 0.0) + value * share
        totals = self._reduce(totals)
        grad_norm = float(self._clip())
        ok = self._agree(math.isfinite(grad_norm) and all(math.isfinite(v) for v in totals.values()))
        if ok:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return (totals if ok else None), grad_norm

    def _micro_rows(self, rollouts: Sequence[Rollout]) -> int:
        """Rows per micro-batch for this minibatch: the configured number, or the sizer's (every rank
        sizes from the whole minibatch, so each runs the same probe forward)."""
        if self.sizer is None:  # a number of rows, not "auto"
            return int(self.micro_batch)
        pad, device = self.policy.tokenizer.pad_token_id, self.policy.device

        def probe(rows: Sequence[Rollout]) -> Any:
            return self._logprobs(self.policy.model, pack(rows, pad, device))

        return self._agree_rows(self.sizer.rows(rollouts, self.policy.model, self.optimizer, probe,
                                                reference=self.loss.kl_coef > 0))

    # ---- data-parallel hooks: one process trains the whole minibatch ------------------------
    def _agree_rows(self, rows: int) -> int:
        """The micro-batch size every process uses (the smallest any of them sized)."""
        return rows

    def _share(self, rollouts: Sequence[Rollout]) -> Sequence[Rollout]:
        """The rollouts of a minibatch this process trains (a rank's share under data parallelism)."""
        return rollouts

    def _reduce(self, totals: dict[str, float]) -> dict[str, float]:
        """After the backward passes, before clipping: combine gradients and loss metrics over processes."""
        return totals

    def _agree(self, ok: bool) -> bool:
        """Whether every process applies this optimizer step."""
        return ok

    def _clip(self) -> torch.Tensor:
        """Clip the gradients to ``max_grad_norm``; their norm before clipping (over every process)."""
        return torch.nn.utils.clip_grad_norm_(self.policy.trainable_parameters(), self.max_grad_norm)

    def _loss(self, batch: dict[str, Any], old_logp: torch.Tensor | None, denominators: dict[str, float]):
        logp, entropy = self._policy_logprobs(batch)
        ref_logp = None  # the frozen base, for the rl component's KL penalty
        if self.loss.kl_coef > 0:
            with torch.no_grad(), self.policy.as_reference() as ref:
                ref_logp = self._logprobs(ref, batch)
        inputs = LossInputs(logp=logp, old_logp=old_logp, advantages=batch["advantages"],
                            rl_weight=batch["rl_weight"], ce_weight=batch["ce_weight"],
                            ref_kl_weight=batch["ref_kl_weight"], ref_kl_logp=batch["ref_logp"], ref_logp=ref_logp,
                            sampler_logp=batch["sampler_logp"], entropy=entropy, denominators=denominators)
        self.token_export.add(batch, logp, entropy, old_logp)
        return compute_loss(inputs, self.loss)

    def _policy_logprobs(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The live policy's [B, C] log-probs of ``batch`` (with gradient), and its entropies if the loss uses them."""
        if self.loss.entropy_coef > 0 or self.token_export.on:
            return self._logprobs(self.policy.model, batch, with_entropy=True)
        return self._logprobs(self.policy.model, batch), None

    def _logprobs(self, model: torch.nn.Module, batch: dict[str, Any], with_entropy: bool = False) -> Any:
        """:func:`completion_logprobs` at the trainer's temperature, precision and layout."""
        return completion_logprobs(model, batch, self.temperature, with_entropy=with_entropy,
                                   autocast=self.autocast, packed=self.packing, share_prompts=self.share_prompts)

    # ---- checkpoints ----------------------------------------------------------------------
    def save(self, path: str) -> None:
        if self.checkpoint_layout == "sharded":  # each process its own shards (checkpoint_io.py)
            return save_sharded(Path(path), self.policy.model, self.optimizer, self.state())
        write_checkpoint(Path(path), self.policy.model, self.optimizer.state_dict(), self.state())

    def load(self, path: str) -> None:
        root = Path(path)
        if is_sharded_checkpoint(root):  # saved by any number of ranks: read whole here
            return self.restore(load_sharded(root, self.policy.model, self.optimizer))
        read_weights(root, self.policy.model)
        self.optimizer.load_state_dict(torch.load(root / "optimizer.pt", weights_only=True))
        self.restore(json.loads((root / "trainer.json").read_text()))

    def state(self) -> dict[str, Any]:
        """What ``trainer.json`` holds: the version, the non-finite counters and the learning-rate schedule."""
        return {"version": self.policy.version, "nonfinite_skips": self.nonfinite_skips,
                "consecutive_skips": self.consecutive_skips, "lr_schedule": self.lr_schedule.as_dict()}

    def restore(self, state: dict[str, Any]) -> None:
        self.policy.version = state["version"]
        self.nonfinite_skips, self.consecutive_skips = state["nonfinite_skips"], state["consecutive_skips"]
        if "lr_schedule" in state:  # the curve the run started on, whatever max_steps says now
            self.lr_schedule = LRSchedule(**state["lr_schedule"])

    def describe(self) -> dict[str, Any]:
        return {"type": "rlvr.backends.train.trainer.TorchTrainer", "lora": self.policy.is_lora,
                "loss": self.loss.policy_loss, "aggregation": self.loss.aggregation,
                "kl_coef": self.loss.kl_coef, "tis_cap": self.loss.tis_cap, "max_grad_norm": self.max_grad_norm,
                "ppo_n_minibatches": self.ppo_n_minibatches, "update_epochs": self.update_epochs,
                "lr": self.lr, "lr_schedule": self.lr_schedule.as_dict(), "autocast": self.autocast,
                "packing": self.packing, "share_prompts": self.share_prompts, "micro_batch": self.micro_batch,
                "micro_batch_tokens": self.micro_batch_tokens, "checkpoint_layout": self.checkpoint_layout,
                "gradient_checkpointing": self.gradient_checkpointing, "heap": self.heap, "offload": self.offload,
                "skip_zero_advantage": self.skip_zero_advantage, **memory_description(self.sizer)}


def _splits(n: int, k: int) -> list[slice]:
    """``min(k, n)`` contiguous slices covering ``range(n)``, the first ``n % k`` one longer
    (at least one slice, so an empty batch still makes one, empty, step as before)."""
    k = max(1, min(k, n))
    size, extra = divmod(n, k)
    starts = [i * size + min(i, extra) for i in range(k + 1)]
    return [slice(starts[i], starts[i + 1]) for i in range(k)]


def pack(rollouts: Sequence[Rollout], pad: int, device: str) -> dict[str, Any]:
    """Right-padded prompt+completion ids and [B, C] completion-aligned tensors: the loss mask, the
    sampler's log-probs and the credit streams (:class:`~rlvr.types.Rollout`). ``ce_weight``,
    ``ref_kl_weight``, ``ref_logp`` and ``token_rewards`` are ``None`` when no rollout of the chunk has
    them, so a plain GRPO batch builds nothing extra; ``critic_mask`` is the loss mask of the rollouts
    whose token rewards a critic turns into advantages (0 on every other row). A stream of the wrong
    length, or a component without what it needs, raises naming the rollout: nothing is trained on
    misaligned tokens."""
    for i, r in enumerate(rollouts):
        check_credit(i, r)
    seqs = [list(r.prompt_ids) + list(r.completion_ids) for r in rollouts]
    width, c_max = max(map(len, seqs)), max(len(r.completion_ids) for r in rollouts) or 1
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    for b, seq in enumerate(seqs):
        ids[b, : len(seq)] = torch.tensor(seq)
        attn[b, : len(seq)] = 1

    def stream(values: Any) -> torch.Tensor:
        out = torch.zeros((len(seqs), c_max))
        for b, row in enumerate(values):
            if row:
                out[b, : len(row)] = torch.tensor(row, dtype=torch.float)
        return out.to(device)

    def optional(name: str) -> torch.Tensor | None:
        rows = [getattr(r, name) for r in rollouts]
        return stream(rows) if any(row is not None and any(row) for row in rows) else None

    mask = stream([r.mask for r in rollouts])
    return {"ids": ids.to(device), "attn": attn.to(device), "mask": mask,
            "advantages": stream([r.advantages for r in rollouts]), "rl_weight": stream([r.rl_mask for r in rollouts]),
            "ce_weight": optional("ce_weights"), "ref_kl_weight": optional("ref_kl_weights"),
            "ref_logp": optional("ref_logprobs"), "sampler_logp": stream([r.logprobs for r in rollouts]),
            "token_rewards": optional("token_rewards"),
            "critic_mask": stream([r.mask if r.token_rewards is not None else () for r in rollouts]),
            "prompt_lens": [len(r.prompt_ids) for r in rollouts],
            "completion_lens": [len(r.completion_ids) for r in rollouts], "c_max": c_max}


def refuse_token_rewards(rollouts: Sequence[Rollout]) -> None:
    """Stop at a rollout whose credit is token rewards for a critic this trainer does not have."""
    for i, r in enumerate(rollouts):
        if r.token_rewards is not None:
            raise BackendError(f"rollout {i} of row {r.task_id!r} carries token rewards for a critic to turn into "
                               "advantages (loop.advantage = 'gae'), and this trainer has no critic")


def carries_loss(rollout: Rollout) -> bool:
    """Whether ``rollout`` adds anything to a loss that is 0 at advantage 0: a nonzero advantage on
    an rl token (a non-finite one counts, so the non-finite guard still sees it), a ``ce`` or
    ``ref_kl`` member, or token rewards (a critic's)."""
    if any(rollout.ce_weights or ()) or any(rollout.ref_kl_weights or ()) or rollout.token_rewards is not None:
        return True
    advantages = rollout.advantages or ()
    return any(a != 0 for a, w in zip(advantages, rollout.rl_mask, strict=False) if w)


def component_units(rollouts: Sequence[Rollout], aggregation: str) -> dict[str, float]:
    """What each loss component is normalised by over a whole minibatch: rl tokens (token-mean) or
    sequences with an rl token (the other modes), ce tokens, ref_kl tokens."""
    if aggregation == "token-mean":
        rl = sum(1 for r in rollouts for w in r.rl_mask if w)
    else:
        rl = sum(1 for r in rollouts if any(r.rl_mask))
    return {"rl": float(rl), "ce": float(sum(1 for r in rollouts for w in r.ce_weights or () if w)),
            "ref_kl": float(sum(1 for r in rollouts for w in r.ref_kl_weights or () if w))}


def completion_logprobs(model: torch.nn.Module, batch: dict[str, Any], temperature: float,
                        with_entropy: bool = False, autocast: str = "none",
                        packed: bool = False,
                        share_prompts: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """[B, C]: log-prob of each completion token under ``model`` (zeros past each completion),
    and with ``with_entropy`` the entropy of the distribution each token was drawn from.
    ``packed`` reads the batch as one padding-free row (:mod:`~rlvr.backends.train.packing`);
    otherwise ``share_prompts`` reads each prompt the batch repeats once
    (:mod:`~rlvr.backends.train.shared_prefix`). Same numbers every way."""
    if packed:
        return packed_completion_logprobs(model, batch, temperature, with_entropy=with_entropy, autocast=autocast)
    if share_prompts:
        shared = shared_prompt_logprobs(model, batch, temperature, with_entropy=with_entropy, autocast=autocast)
        if shared is not None:
            return shared
    # Only the positions that predict a completion token reach the output head.
    ids = batch["ids"]
    rows, index = completion_positions(batch["completion_lens"], ids.device)
    at = torch.tensor(batch["prompt_lens"], device=ids.device)[rows] - 1 + index
    picked = selected_logprobs(model, forward_inputs(ids, batch["attn"]), rows, at, ids[rows, at + 1], temperature,
                               with_entropy=with_entropy, autocast=autocast)
    return spread(picked, rows, index, (ids.shape[0], batch["c_max"]))
