"""``[train]``: the trainer, the loss and the training levers users reach for every week.

Each lever's description names what TRL's ``GRPOConfig`` and verl's config call it (the table of
``docs/levers.md``). A lever that does not apply to the chosen setting is refused at load, naming
what it needs (a loss knob the policy loss does not read, a warmup key given twice, a decay
fraction for a schedule that has none), never silently ignored. Cross-section rules (the
overlong buffer against ``sampler.max_new_tokens``, shaping of multi-turn episodes) are checked by
:class:`~rlvr.config.run.RunConfig`.
Standard library + pydantic only.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from rlvr.config import StrictModel

BUILT_IN_LOSSES = ("grpo", "ppo", "dapo", "gspo", "cispo", "importance_sampling", "reinforce", "dro", "dppo")

LOSS_KNOBS: dict[str, tuple[str, ...]] = {
    "clip_eps_low": ("dapo", "gspo", "ppo"),
    "clip_eps_high": ("dapo", "gspo", "ppo"),
    "dual_clip": ("dapo", "ppo"),
    "cispo_cap": ("cispo",),
    "dro_beta": ("dro",),
    "dppo_mask_low": ("dppo",),
    "dppo_mask_high": ("dppo",),
    "dppo_adv_tau": ("dppo",),
    "dppo_kl_tau": ("dppo",),
}
"""Which built-in policy losses read each loss knob (the loss library's own table, checked equal by a test)."""


class TrainSection(StrictModel):
    """Trainer and loss settings (see :mod:`rlvr.backends.train.losses` and ``docs/levers.md``).

    ``policy_loss`` is a built-in name or a custom loss ``package.module:function`` /
    ``path/file.py:function``, called as ``fn(logp, old_logp, adv, mask, **params)`` (see
    :mod:`rlvr.backends.train.losses.custom`) with ``policy_loss_kwargs`` (a table of scalars, for
    custom losses only) among its keyword arguments; it is imported and checked when the run is
    built, before anything is written. ``aggregation`` unset means the policy loss's own default:
    ``seq-mean-token-mean`` for ``gspo`` (its paper's objective), ``token-mean`` for every other.
    The loss knobs (``clip_eps_low`` ...) unset mean the loss's own defaults (ppo ε 0.2/0.2, dapo
    0.2/0.28, gspo 3e-4/4e-4, cispo cap 5.0, dro β 0.05, dppo masks 0.2/0.2 with τ_adv 1 and τ_KL 1e-3).

    Memory (docs/memory.md): the output head and log-softmax always run in chunks of positions with
    their own backward, never holding a micro-batch's [tokens, vocabulary] logits (what TRL's
    ``use_liger_kernel=True``, Liger's fused linear cross-entropy, verl's ``use_fused_kernels`` and
    NeMo-RL's chunked log-probs do; no key: always on). ``micro_batch = "auto"`` sizes micro-batches to
    ``memory_budget_frac`` of the free memory; ``gradient_checkpointing`` trades a forward pass for most
    of the activations; ``release_freed_memory`` keeps a CPU process's RSS at its live tensors.
    """

    policy_loss: Literal["grpo", "ppo", "dapo", "gspo", "cispo", "importance_sampling", "reinforce", "dro",
                         "dppo"] | str = (
        Field("grpo", description="a built-in name, or 'package.module:function' / "
              "'path/file.py:function'"))
    policy_loss_kwargs: dict[str, bool | int | float | str] = Field(
        default_factory=dict, description="extra keyword arguments for a custom policy_loss")
    aggregation: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "constant"] | None = Field(
        None, description="unset: the policy loss's default (seq-mean-token-mean for gspo, else token-mean)")
    constant_normaliser: float | None = Field(None, gt=0, description="for aggregation = 'constant'")
    # ---- loss knobs of the built-in losses ------------------------------------------------------------
    clip_eps_low: float | None = Field(None, gt=0, lt=1, description="ε_low of the clipped losses (ppo, dapo, "
                                       "gspo): ratio clipped below at 1 − ε_low. TRL `epsilon`, verl `clip_ratio_low`")
    clip_eps_high: float | None = Field(None, gt=0, description="ε_high (clip-higher; DAPO 0.28) of ppo, dapo, gspo: "
                                        "ratio clipped above at 1 + ε_high. TRL `epsilon_high`, verl `clip_ratio_high`")
    dual_clip: float | None = Field(None, gt=1, description="dual clip c > 1 of ppo, dapo: the loss of a negative "
                                    "advantage bounded by −A·c. TRL: none; verl `clip_ratio_c`")
    cispo_cap: float | None = Field(None, ge=1, description="cispo's absolute cap on the IS weight (default 5.0). "
                                    "TRL `epsilon_high` with loss_type='cispo'; verl clips two-sided instead")
    dro_beta: float | None = Field(None, gt=0, description="dro's quadratic penalty β (default 0.05). "
                                   "TRL: none; verl `policy_loss.dro_beta`")
    dppo_mask_low: float | None = Field(None, gt=0, description="dppo: a token with A ≤ 0 leaves the policy "
                                        "gradient once π − π_sampler < −dppo_mask_low (default 0.2). prime-rl "
                                        "`dppo_mask_low`; verl `clip_ratio_low` with loss_mode='dppo_tv'; TRL: none")
    dppo_mask_high: float | None = Field(None, gt=0, description="dppo: a token with A > 0 leaves the policy "
                                         "gradient once π − π_sampler > dppo_mask_high (default 0.2). prime-rl "
                                         "`dppo_mask_high`; verl `clip_ratio_high` with loss_mode='dppo_tv'; TRL: none")
    dppo_adv_tau: float | None = Field(None, gt=0, description="dppo: the advantage's scale τ_adv (default 1). "
                                       "prime-rl `adv_tau`; verl, TRL: none")
    dppo_kl_tau: float | None = Field(None, ge=0, description="dppo: τ_KL of the (logπ − logπ_sampler)² penalty on "
                                      "every rl token, masked ones included (default 1e-3). prime-rl `kl_tau`; "
                                      "verl, TRL: none")
    kl_estimator: Literal["k1", "k2", "k3"] = Field("k3", description="the KL-to-reference estimator (with "
                                                    "loop.kl_coef). verl `kl_loss_type`")
    entropy_coef: float = Field(0.0, ge=0, description="entropy bonus weight. verl `entropy_coeff`")
    # ---- importance sampling against the sampler -----------------------------------------------------------
    tis_cap: float | None = Field(None, gt=0, description="truncated IS: the loss weighted by min(π_old/π_sampler, "
                                  "cap). TRL `vllm_importance_sampling_clip_max` (mode *_truncate), verl "
                                  "`rollout_is_threshold`")
    mis_high: float | None = Field(None, gt=0, description="masked IS (IcePop): weight π_old/π_sampler kept inside "
                                   "[mis_low, mis_high], 0 outside. TRL `vllm_importance_sampling_clip_max` (mode "
                                   "*_mask), verl `rollout_is_threshold` with rejection")
    mis_low: float | None = Field(None, ge=0, description="masked IS lower bound (unset: none, as TRL). TRL "
                                  "`vllm_importance_sampling_clip_min`, verl `rollout_is_threshold_lower`")
    is_level: Literal["token", "sequence", "sequence_product"] = Field(
        "token", description="the ratio tis_cap / mis_* act on: each token's, the sequence's geometric mean "
        "exp(mean ℓ) ('sequence'), or its product exp(Σ ℓ) ('sequence_product', TRL's sequence_* and verl's "
        "'sequence'). TRL `vllm_importance_sampling_mode`, verl `rollout_is_level`")
    # ---- credit shaping (applied to scored groups: rlvr.rollouts.shaping) ---------------------------------
    mask_truncated_completions: bool = Field(False, description="a completion cut by the token budget carries no "
                                             "policy-gradient signal (its reward still counts in its group's "
                                             "baseline). TRL `mask_truncated_completions`; verl: none")
    overlong_buffer: int | None = Field(None, ge=1, description="DAPO soft overlong punishment: a linear penalty "
                                        "over the last N tokens of sampler.max_new_tokens, recorded as "
                                        "reward/overlong. TRL `soft_punish_cache`, verl `overlong_buffer.len`")
    overlong_penalty: float = Field(1.0, gt=0, description="the penalty at the full budget. TRL: 1 (fixed), "
                                    "verl `overlong_buffer.penalty_factor`")
    length_penalty: float = Field(0.0, ge=0, description="w: reward − w · (group mean reward) · len / (group's "
                                  "longest len), recorded as reward/length. prime-rl `length_penalty` "
                                  "(num_output_tokens_weight); TRL, verl: none")
    # ---- optimizer, schedule, passes --------------------------------------------------------------------------
    lr_schedule: Literal["constant", "linear", "cosine", "wsd"] = Field(
        "constant", description="the learning rate's curve over the run (peak: loop.lr); wsd = warmup-stable-decay. "
        "TRL `lr_scheduler_type`, verl `optim.lr_scheduler_type` / `warmup_style`")
    warmup_steps: int | None = Field(None, ge=0, description="train steps rising linearly to loop.lr. TRL "
                                     "`warmup_steps`, verl `optim.lr_warmup_steps`")
    warmup_ratio: float | None = Field(None, ge=0, lt=1, description="warmup as a fraction of the run's steps "
                                       "(rounded up). TRL `warmup_ratio`, verl `optim.lr_warmup_steps_ratio`")
    min_lr_ratio: float = Field(0.0, ge=0, le=1, description="where linear, cosine and wsd decay to, as a fraction "
                                "of loop.lr. TRL `lr_scheduler_kwargs.min_lr_rate`, verl `optim.min_lr_ratio`")
    decay_ratio: float | None = Field(None, gt=0, le=1, description="wsd: the fraction of the run spent decaying "
                                      "(default 0.1). TRL `lr_scheduler_kwargs.num_decay_steps`; verl: none")
    update_epochs: int = Field(1, ge=1, description="passes over each batch (each of its ppo_n_minibatches), all "
                               "against the batch's old-policy snapshot. TRL `num_iterations`, verl `ppo_epochs`")
    ppo_n_minibatches: int = Field(1, ge=1, description="optimizer steps per pass over a batch (PPO minibatches). "
                                   "TRL `steps_per_generation`; verl train_batch_size / `ppo_mini_batch_size`")
    lora_alpha: float = Field(32.0, gt=0, description="LoRA alpha (scale alpha / rank). PEFT `lora_alpha`")
    lora_targets: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        description="modules LoRA adapts. PEFT `target_modules`")
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping norm. TRL `max_grad_norm`, verl `grad_clip`")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    max_nonfinite: int = Field(3, ge=1, description="consecutive non-finite losses or gradients (each step skipped) "
                               "before the run stops")
    # ---- memory (docs/memory.md) -------------------------------------------------------------------------------
    micro_batch: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        256, description="rows per forward-backward (default: 'auto' for a named model.base, 256 for the tiny "
        "model: 'auto' follows free memory, so two runs may split a batch differently); 'auto': the most rows "
        "whose estimated memory fits "
        "memory_budget_frac of the free memory, sized at every minibatch and reported as train/micro_batch. TRL "
        "`per_device_train_batch_size`, verl `ppo_micro_batch_size_per_gpu` (`use_dynamic_bsz` sizes by tokens)")
    memory_budget_frac: float = Field(
        0.25, gt=0, le=1, description="with micro_batch = 'auto': the share of the memory free at each minibatch "
        "(CUDA: the device's; CPU: MemAvailable less the watchdog's floor) one micro-batch may take; the rest is "
        "left to the machine's other work. TRL: none; verl: none (`ppo_max_token_len_per_gpu` fixes tokens "
        "instead)")
    gradient_checkpointing: bool = Field(
        False, description="recompute each decoder layer's activations in the backward instead of keeping them: "
        "the activations drop to each layer's input plus one layer's, for about one more forward pass; same "
        "gradients. LoRA and full fine-tune, with share_prompts and packing. TRL `gradient_checkpointing`, verl "
        "`model.enable_gradient_checkpointing`")
    release_freed_memory: bool | None = Field(
        None, description="CPU memory (Linux, glibc): every freed block of 128 KiB or more goes back to the "
        "system at once instead of staying in the process's heap, so the RSS follows the live tensors "
        "(SmolLM2-135M LoRA, 64 rows x 64 tokens, with gradient_checkpointing: 5.96 -> 1.21 GiB for the step) "
        "for a page fault per fresh page (that step: 23.8 -> 37 s). Unset: on where micro_batch = 'auto' sizes "
        "on CPU (its estimate counts live tensors; without this the heap keeps several times them). "
        "Process-wide; see docs/memory.md. TRL, verl: none")
    token_export: bool = Field(
        False, description="every trainer rank writes what it trained on, one JSON line per sequence per optimizer "
        "step with per-token arrays (ids, mask, advantages, rl/ce/ref_kl weights, sampler, trainer and snapshot "
        "log-probs, entropy, ratio, mismatch KL), to token_exports/step_N/rank_R.jsonl, and rank_R.complete when "
        "its part of the step is done (docs/record.md). prime-rl `trainer.experimental.token_export`; TRL, "
        "verl: none")
    reference_on_cpu: bool = Field(False, description="keep the KL reference model on the CPU (device memory)")
    offload: Literal["none", "optimizer", "params"] = Field(
        "none", description="CPU offload of the trainer's state, for a policy on a GPU (model.device = 'cuda'): "
        "'optimizer' keeps AdamW's moments and a float32 master copy of the trainable weights in host memory "
        "(one process or shard = 'replicate'; each step copies the gradients out and the weights back); 'params' "
        "(shard = 'fsdp') is FSDP2's CPUOffloadPolicy: each rank's shards of the weights, gradients and AdamW state "
        "in host memory, a layer's weights on the device only for its passes. Same updates; see docs/memory.md. "
        "TRL/DeepSpeed `offload_optimizer`/`offload_param`, verl "
        "`actor_rollout_ref.actor.fsdp_config.optimizer_offload` and "
        "`actor_rollout_ref.actor.fsdp_config.param_offload`")
    shard: Literal["replicate", "fsdp"] = Field(
        "replicate", description="under several trainer ranks: 'replicate' keeps the whole policy on every rank; "
        "'fsdp' shards it over the ranks with FSDP2 (sampling and held-out then run on servers)")
    shard_size: int | None = Field(
        None, ge=1, description="under shard = 'fsdp': the ranks each copy of the policy is sharded over (hybrid "
        "shard, HSDP: --nproc / shard_size copies, gradients summed over all); it must divide --nproc. Unset: "
        "one copy over every rank. Typically the GPUs of one node. verl `fsdp_config.fsdp_size`; TRL (accelerate) "
        "`HYBRID_SHARD`; see docs/trainer_ranks.md")
    checkpoint_layout: Literal["gathered", "sharded"] = Field(
        "gathered", description="'gathered': checkpoints hold the adapter or full weights whole (written by rank 0 "
        "from a gather under shard = 'fsdp'); 'sharded': every rank writes its own shards with "
        "torch.distributed.checkpoint (trainer/sharded/), no gather; either resumes on any number of ranks, and "
        "`rlvr export` turns either into a plain adapter and merged model. verl: always per-rank shards; TRL: "
        "whole; see docs/trainer_ranks.md")
    tensor_parallel: int = Field(1, ge=1, description="under shard = 'fsdp': split each decoder layer's linear "
                                 "layers over this many trainer ranks too (a 2-D mesh, FSDP2 over the rest); it "
                                 "must divide --nproc and the model's heads and MLP width; see docs/trainer_ranks.md")
    sequence_parallel: int = Field(
        1, ge=1, description="Ulysses sequence parallelism: split every sequence into this many contiguous slices, "
        "one per trainer rank (--nproc must equal it), with an all-to-all over attention heads around each "
        "attention; weights replicated, same log-probs and gradients as one process. The heads and key-value "
        "heads must divide by it; not with shard = 'fsdp', tensor_parallel, packing or micro_batch = 'auto'; see "
        "docs/trainer_ranks.md. verl `actor_rollout_ref.actor.ulysses_sequence_parallel_size`, "
        "TRL/accelerate `sp_size`")
    autocast: Literal["none", "bfloat16"] = Field(
        "none", description="bfloat16: the body's forward-backward under bf16 autocast (weights, adapter and "
        "optimizer stay float32; output head and log-softmax float32); see docs/speed.md")
    packing: bool = Field(False, description="read each micro-batch as one padding-free row (position ids "
                          "restart per sequence); same log-probs, see docs/speed.md")
    micro_batch_tokens: int | None = Field(
        None, ge=1, description="the most tokens one micro-batch (one device's forward-backward) may read: rows "
        "are taken in order while they fit (packing: their real tokens; else rows x the longest), besides the "
        "micro_batch rows; a rollout longer than this stops the step naming it. Same gradient. Reported as "
        "train/micro_batch_tokens. verl `ppo_max_token_len_per_gpu` (with `use_dynamic_bsz`); TRL: none")
    skip_zero_advantage: bool = Field(True, description="leave out of the forward-backward the rollouts that "
                                      "cannot move the weights: advantage 0 on every token (a group whose samples "
                                      "all scored alike), no other loss term, under a loss that is 0 at advantage "
                                      "0 (no kl_coef or entropy_coef; grpo, ppo, dapo, gspo, cispo, "
                                      "importance_sampling, reinforce). Their tokens still count in the "
                                      "normaliser: same gradient, see docs/speed.md. TRL, verl: none")
    share_prompts: bool = Field(True, description="read a prompt that several rows of a micro-batch repeat once "
                                "(a group's completions share it), forward and backward; same log-probs and "
                                "gradients, see docs/speed.md. Not used with packing, nor under shard = 'fsdp'")

    @model_validator(mode="after")
    def _loss_knobs_fit_the_loss(self) -> TrainSection:
        custom = self.policy_loss not in BUILT_IN_LOSSES
        for knob, users in LOSS_KNOBS.items():
            if getattr(self, knob) is None or self.policy_loss in users:
                continue
            if custom:
                raise ValueError(f"train.{knob} is a knob of the built-in losses {list(users)}; a custom "
                                 "policy_loss takes its settings from train.policy_loss_kwargs")
            raise ValueError(f"train.{knob} is not used by policy_loss = {self.policy_loss!r} (only by "
                             f"{list(users)}); leave it unset or pick one of those losses")
        return self

    @model_validator(mode="after")
    def _sequence_split_fits(self) -> TrainSection:
        sp = self.sequence_parallel
        if sp == 1:
            return self
        clash = [name for name, bad in (("shard = 'fsdp'", self.shard == "fsdp"),
                                        ("tensor_parallel > 1", self.tensor_parallel > 1),
                                        ("packing = true", self.packing),
                                        ("micro_batch = 'auto'", self.micro_batch == "auto")) if bad]
        if clash:
            raise ValueError(f"train.sequence_parallel = {sp} runs with replicated weights on right-padded rows of a "
                             f"set micro_batch; it does not combine with {', '.join(clash)}")
        return self

    @model_validator(mode="after")
    def _auto_is_unsharded(self) -> TrainSection:
        if self.micro_batch == "auto" and self.shard == "fsdp":
            raise ValueError("train.micro_batch = 'auto' sizes from a probe of unsharded weights; under shard = "
                             "'fsdp' set train.micro_batch to a number of rows")
        return self

    @model_validator(mode="after")
    def _one_is_correction(self) -> TrainSection:
        if self.tis_cap is not None and self.mis_high is not None:
            raise ValueError("train.tis_cap (truncate the IS weight) and train.mis_high (mask it) are two corrections "
                             "of the same weight; set one of them")
        if self.mis_low is not None and self.mis_high is None:
            raise ValueError("train.mis_low is the lower bound of masked IS: set train.mis_high too")
        if self.mis_low is not None and self.mis_high is not None and self.mis_low >= self.mis_high:
            raise ValueError(f"train.mis_low={self.mis_low} must be below train.mis_high={self.mis_high}")
        if self.is_level != "token" and self.tis_cap is None and self.mis_high is None:
            raise ValueError(f"train.is_level = {self.is_level!r} is the level of an IS correction: set "
                             "train.tis_cap or train.mis_high, or leave is_level unset")
        if self.overlong_penalty != 1.0 and self.overlong_buffer is None:
            raise ValueError("train.overlong_penalty scales the overlong shaping: set train.overlong_buffer too")
        return self

    @model_validator(mode="after")
    def _schedule_keys_fit(self) -> TrainSection:
        if self.warmup_steps is not None and self.warmup_ratio is not None:
            raise ValueError("train.warmup_steps and train.warmup_ratio both set the warmup; set one of them")
        if self.decay_ratio is not None and self.lr_schedule != "wsd":
            raise ValueError(f"train.decay_ratio is the decay phase of lr_schedule = 'wsd', not "
                             f"{self.lr_schedule!r}; leave it unset")
        if self.min_lr_ratio and self.lr_schedule == "constant":
            raise ValueError("train.min_lr_ratio is where a decaying lr_schedule ends; lr_schedule = 'constant' "
                             "never decays: set lr_schedule = 'linear', 'cosine' or 'wsd', or leave it unset")
        return self
