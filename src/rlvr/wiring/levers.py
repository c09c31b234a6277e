"""The training levers of a :class:`~rlvr.config.run.RunConfig` as what the run builds from them:
the loss (:class:`~rlvr.backends.train.losses.LossConfig`), the learning-rate schedule over the run's
steps, the credit shaping of every scored group, and the rows as the run shows them (with their
system prompt). Each refusal names the config key at fault. See ``docs/levers.md``.
Part of the composition root: imports the loss library (torch).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from rlvr.backends.train.losses import LossConfig
from rlvr.config.run import RunConfig
from rlvr.data.tasks import with_system_prompt
from rlvr.errors import ConfigError
from rlvr.lr_schedule import LRSchedule, plan_schedule, schedule_horizon
from rlvr.rollouts.shaping import Shaping
from rlvr.types import Split, Task


def shown(cfg: RunConfig, tasks: Sequence[Task]) -> list[Task]:
    """``tasks`` as the run shows them: each with its section's ``system_prompt`` (``[task]``, or the
    ``[envs.NAME]`` it belongs to) as its first message."""
    sections = cfg.env_sections()
    return [with_system_prompt(t, sections[t.env].system_prompt) if t.env in sections else t for t in tasks]


def shown_split(cfg: RunConfig, split: Split) -> Split:
    """The split carved from the rows, its tasks shown with their system prompts (its hashes stay the rows')."""
    return dataclasses.replace(split, train=tuple(shown(cfg, split.train)), heldout=tuple(shown(cfg, split.heldout)))


def loss_config(cfg: RunConfig) -> LossConfig:
    """The trainer's loss settings; a bad combination, or a custom ``train.policy_loss`` that does not
    import or cannot be called as a policy loss, fails naming the ``train.`` key."""
    t = cfg.train
    try:
        return LossConfig(policy_loss=t.policy_loss, aggregation=t.aggregation,
                          constant_normaliser=t.constant_normaliser, kl_coef=cfg.loop.kl_coef,
                          kl_estimator=t.kl_estimator, entropy_coef=t.entropy_coef, tis_cap=t.tis_cap,
                          mis_low=t.mis_low, mis_high=t.mis_high, is_level=t.is_level,
                          clip_eps_low=t.clip_eps_low, clip_eps_high=t.clip_eps_high, dual_clip=t.dual_clip,
                          cispo_cap=t.cispo_cap, dro_beta=t.dro_beta, dppo_mask_low=t.dppo_mask_low,
                          dppo_mask_high=t.dppo_mask_high, dppo_adv_tau=t.dppo_adv_tau, dppo_kl_tau=t.dppo_kl_tau,
                          policy_loss_kwargs=t.policy_loss_kwargs)
    except ValueError as exc:
        raise ConfigError(f"[train]: {str(exc).replace('LossConfig.', 'train.')}") from None


def lr_schedule(cfg: RunConfig, n_train: int | None = None) -> LRSchedule:
    """The learning-rate schedule over the run's steps: ``loop.max_steps``, or fewer when ``loop.epochs``
    passes over the ``n_train`` training rows end sooner. A warmup that leaves no room to decay fails
    naming the ``train.`` keys."""
    t, loop = cfg.train, cfg.loop
    total = loop.max_steps if n_train is None else schedule_horizon(loop.max_steps, loop.epochs, n_train,
                                                                    loop.tasks_per_step)
    try:
        return plan_schedule(t.lr_schedule, total, warmup_steps=t.warmup_steps, warmup_ratio=t.warmup_ratio,
                             min_lr_ratio=t.min_lr_ratio, decay_ratio=t.decay_ratio)
    except ValueError as exc:
        raise ConfigError(f"[train]: {exc} (train.lr_schedule = {t.lr_schedule!r}, train.warmup_steps / "
                          f"warmup_ratio, over {total} steps from loop.max_steps / loop.epochs)") from None


def shaping(cfg: RunConfig) -> Shaping:
    """The credit shaping of ``[train]`` (:mod:`rlvr.rollouts.shaping`), at ``sampler.max_new_tokens``."""
    t = cfg.train
    return Shaping(mask_truncated=t.mask_truncated_completions, overlong_buffer=t.overlong_buffer,
                   overlong_penalty=t.overlong_penalty, length_penalty=t.length_penalty,
                   max_tokens=cfg.completion_budget)
