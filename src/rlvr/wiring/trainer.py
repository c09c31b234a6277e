"""The policy and its trainer: LoRA or full weights over the base, one process or trainer ranks
(data-parallel or sharded), with the critic when ``loop.advantage = 'gae'``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlvr.backends.model.policy import LoraSpec, Policy
from rlvr.backends.model.tokenizer import use_chat_template
from rlvr.backends.train.critic import CriticConfig, CriticTrainer
from rlvr.backends.train.distributed import Ranks, RankTrainer
from rlvr.backends.train.losses import LossConfig
from rlvr.backends.train.sharded import ShardedTrainer
from rlvr.backends.train.token_export import TokenExport
from rlvr.backends.train.trainer import TorchTrainer
from rlvr.config.run import RunConfig
from rlvr.errors import ConfigError
from rlvr.lr_schedule import LRSchedule
from rlvr.record.token_exports import EXPORT_DIR
from rlvr.wiring.levers import loss_config, lr_schedule
from rlvr.wiring.scale.sharding import is_sharded


def make_policy(cfg: RunConfig, base: Path, *, need_reference: bool | None = None) -> Policy:
    """The run's policy on ``base`` (LoRA or full weights, as configured), at version 0."""
    lora = LoraSpec(rank=cfg.loop.lora_rank, alpha=cfg.train.lora_alpha, targets=tuple(cfg.train.lora_targets))
    policy = Policy(str(base), lora=lora, dtype=cfg.model.dtype, device=cfg.model.device,
                    reference_on_cpu=cfg.train.reference_on_cpu,
                    need_reference=cfg.loop.kl_coef > 0 if need_reference is None else need_reference,
                    seed=cfg.loop.seed)
    use_chat_template(policy.tokenizer, cfg.model.chat_template, "model.chat_template")  # saved with checkpoints
    return policy


def make_trainer(cfg: RunConfig, policy: Policy, ranks: Ranks | None = None,
                 schedule: LRSchedule | None = None, run_dir: Path | None = None, *,
                 loss: LossConfig | None = None) -> TorchTrainer:
    """The run's trainer over ``policy``; its ``load`` restores a checkpoint's weights, version and
    learning-rate schedule. With ``ranks`` (a data-parallel group), this rank's part of the group's
    trainer. ``schedule``: the run's (:func:`lr_schedule`); default: over ``loop.max_steps``.
    ``run_dir``: where ``train.token_export`` writes (no export without it: an evaluation trains nothing).
    ``loss``: the run's (:func:`loss_config`, built once by the plan); default: built here."""
    cls: Any = TorchTrainer if ranks is None else ShardedTrainer if is_sharded(cfg) else RankTrainer
    t = cfg.train
    settings = dict(loss=loss or loss_config(cfg), lr=cfg.loop.lr, weight_decay=t.weight_decay,
                    max_grad_norm=t.max_grad_norm, temperature=cfg.loop.temp, max_nonfinite=t.max_nonfinite,
                    micro_batch=t.micro_batch, ppo_n_minibatches=t.ppo_n_minibatches, autocast=t.autocast,
                    packing=t.packing, share_prompts=t.share_prompts, update_epochs=t.update_epochs,
                    lr_schedule=schedule or lr_schedule(cfg), gradient_checkpointing=t.gradient_checkpointing,
                    memory_budget_frac=t.memory_budget_frac, memory_floor_frac=memory_floor(cfg),
                    release_freed_memory=t.release_freed_memory, offload=t.offload,
                    token_export=token_export(cfg, ranks, run_dir), micro_batch_tokens=t.micro_batch_tokens,
                    checkpoint_layout=t.checkpoint_layout, skip_zero_advantage=t.skip_zero_advantage,
                    log=print if ranks is None or ranks.rank == 0 else None)
    if cfg.uses_critic():  # a value head on the policy's body (backends/train/critic.py)
        check_critic(cfg, ranks)
        return CriticTrainer(policy, critic=CriticConfig(**cfg.critic.model_dump()), **settings)
    if t.sequence_parallel > 1:  # each sequence split over the ranks (backends/train/sequence_parallel.py)
        if ranks is None:
            raise ConfigError(f"train.sequence_parallel = {t.sequence_parallel} splits each sequence over trainer "
                              f"ranks, and this run has one process: run it with --nproc {t.sequence_parallel}")
        from rlvr.backends.train.sequence_parallel import SequenceParallelTrainer

        return SequenceParallelTrainer(policy, sequence_parallel=t.sequence_parallel, **settings)
    if cls is ShardedTrainer and t.tensor_parallel > 1:  # a 2-D mesh: tensor slices beside FSDP2's shards
        from rlvr.backends.train.tensor_parallel import TensorParallelTrainer

        return TensorParallelTrainer(policy, tensor_parallel=t.tensor_parallel, **settings)
    if cls is ShardedTrainer and t.shard_size is not None:  # a 2-D mesh: replicas of FSDP2's shards
        from rlvr.backends.train.hybrid_shard import HybridShardTrainer

        return HybridShardTrainer(policy, shard_size=t.shard_size, **settings)
    return cls(policy, **settings)


def token_export(cfg: RunConfig, ranks: Ranks | None, run_dir: Path | None) -> TokenExport | None:
    """This rank's token export (``train.token_export``), into the run folder every rank writes to."""
    if not cfg.train.token_export or run_dir is None:
        return None
    return TokenExport(run_dir / EXPORT_DIR, run=run_dir.resolve().name, rank=ranks.rank if ranks else 0,
                       world_size=ranks.world_size if ranks else 1)


def memory_floor(cfg: RunConfig) -> float:
    """The share of system memory the micro-batch sizer leaves free: the memory watchdog's floor, where it watches."""
    return (cfg.watchdog.floor_available_frac or 0.0) if cfg.watchdog.enabled else 0.0


def check_critic(cfg: RunConfig, ranks: Ranks | None) -> None:
    """A critic trains in one trainer process: refused under trainer ranks (each would train its own head)."""
    if cfg.uses_critic() and ranks is not None:
        raise ConfigError(f"loop.advantage = 'gae' trains a critic (a value head) in the trainer's process, and this "
                          f"run has {ranks.world_size} trainer ranks, whose heads would drift apart: run it with one "
                          "trainer process (no --nproc), or pick another loop.advantage")
