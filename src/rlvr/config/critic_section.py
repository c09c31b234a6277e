"""``[critic]``: the value model of ``loop.advantage = 'gae'`` (PPO with a critic; docs/critic.md).

The critic is a value head on the policy's body (:mod:`rlvr.backends.train.critic`), trained beside
the policy with the LoRA adapter or the full weights. Every key is refused unless the run's credit
comes from a critic (``loop.advantage = 'gae'`` with an algorithm that reads ``loop.advantage``):
a critic setting never sits silently unused. Each description names what verl and TRL call it.
Standard library + pydantic only.
"""

from __future__ import annotations

from pydantic import Field

from rlvr.config import StrictModel


class CriticSection(StrictModel):
    """The critic's settings; the defaults are verl's (γ = λ = 1, value clip 0.5, no warm-up)."""

    gamma: float = Field(1.0, ge=0, le=1, description="discount per token position in GAE (1: the reward at "
                         "the last token counts fully at every token). verl `algorithm.gamma`, TRL PPO `gamma`")
    lam: float = Field(1.0, ge=0, le=1, description="GAE's λ: 1 is the Monte-Carlo return minus the value, 0 "
                       "the one-step TD error. verl `algorithm.lam`, TRL PPO `lam`")
    value_clip: float = Field(0.5, gt=0, allow_inf_nan=False, description="the clipped value loss keeps the "
                              "larger of (V − R)² and (clip(V, V_old ± value_clip) − R)². verl "
                              "`critic.cliprange_value`, TRL PPO `cliprange_value`")
    lr: float = Field(1e-3, gt=0, le=1, description="learning rate of the value head's own AdamW (the body "
                      "learns at loop.lr). verl `critic.optim.lr`")
    warmup_steps: int = Field(0, ge=0, description="the first N train steps train the critic alone: the "
                              "policy does not move (no policy gradient, no optimizer step). verl "
                              "`trainer.critic_warmup`")
    vf_coef: float = Field(0.1, ge=0, le=1, description="the share of the value loss's gradient that reaches "
                           "the policy's body (LoRA adapter or full weights); the head always gets all of it; "
                           "0 keeps the body the actor's alone. TRL PPO `vf_coef`; verl: none (its critic is "
                           "a separate model)")
