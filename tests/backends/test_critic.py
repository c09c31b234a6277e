"""The critic trainer on the tiny model: GAE credit from a value head on the policy's body.

- the first call's returns are the hand-computed GAE returns of a zero critic;
- the three layouts (padded, shared prompts, packed) read the same values from one forward;
- warm-up trains the head alone: the actor's weights do not move, then they do;
- a checkpoint holds the critic, and a trainer loaded from it takes the same next step;
- a trainer without a critic refuses token rewards, naming the row.
"""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

import torch  # noqa: E402

from rlvr.algos import GRPO  # noqa: E402
from rlvr.backends.model.policy import LoraSpec, Policy  # noqa: E402
from rlvr.backends.model.tiny import build_tiny_model  # noqa: E402
from rlvr.backends.sample.batched import TransformersSampler  # noqa: E402
from rlvr.backends.train.critic import CriticConfig, CriticTrainer  # noqa: E402
from rlvr.backends.train.trainer import TorchTrainer  # noqa: E402
from rlvr.data.tasks import load_tasks  # noqa: E402
from rlvr.envs.tasks.arithmetic import make_rows  # noqa: E402
from rlvr.errors import BackendError  # noqa: E402
from rlvr.types import Batch  # noqa: E402

pytestmark = pytest.mark.train


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "base", hidden=32, layers=2, heads=2, seed=0)


@pytest.fixture(scope="module")
def groups(base):
    """Two rows of four samples each, rewarded 0, 1, 0, 1, credited by ``grpo`` with ``gae``."""
    policy = Policy(str(base), lora=LoraSpec(rank=4, alpha=8.0))
    tasks = load_tasks(make_rows(8, seed=3))[:2]
    sampled = TransformersSampler(policy, max_new_tokens=4, temperature=1.0, seed=0)(tasks, 4)
    algo = GRPO("gae")
    return tuple(algo.assign(task, [[dataclasses.replace(r, reward=float(i % 2))] for i, r in enumerate(g)])
                 for task, g in zip(tasks, sampled, strict=True))


def critic_trainer(base, **kwargs):
    critic = kwargs.pop("critic", CriticConfig())
    return CriticTrainer(Policy(str(base), lora=LoraSpec(rank=4, alpha=8.0)), critic=critic, lr=1e-2, **kwargs)


def actor_state(trainer):
    return {k: v.detach().clone() for k, v in trainer.policy.model.named_parameters() if v.requires_grad}


def test_a_zero_critic_gives_the_reward_as_every_token_return(base, groups):
    trainer = critic_trainer(base)
    metrics = trainer(Batch(1, groups))
    # A zero value head, γ = λ = 1: R_t = the row's reward at every trained token, so the mean return is the
    # token-weighted mean reward and the old values explain nothing.
    rollouts = [r for g in groups for r in g.rollouts]
    tokens = [sum(r.mask) for r in rollouts]
    expected = sum(n * r.reward for n, r in zip(tokens, rollouts, strict=True)) / sum(tokens)
    assert metrics["critic/returns_mean"] == pytest.approx(expected, abs=1e-6)
    assert metrics["critic/values_mean"] == 0.0
    assert metrics["critic/explained_variance"] == pytest.approx(0.0, abs=1e-4)
    # ½·token-mean((0 − R)²) with R ∈ {0, 1}: half the share of tokens in rewarded rows.
    assert metrics["loss/value"] == pytest.approx(0.5 * expected, abs=1e-6)
    assert metrics["critic/grad_norm"] > 0 and metrics["critic/warmup"] == 0.0


@pytest.mark.parametrize("layout", [dict(share_prompts=True), dict(packing=True)])
def test_every_layout_reads_the_same_values(base, groups, layout):
    padded = critic_trainer(base, share_prompts=False)
    other = critic_trainer(base, **layout)
    for step in (1, 2):
        a, b = padded(Batch(step, groups)), other(Batch(step, groups))
        for key in ("loss/value", "critic/vpred_mean", "critic/values_mean", "critic/explained_variance", "loss/rl"):
            assert b[key] == pytest.approx(a[key], abs=1e-5), key


def test_warmup_trains_the_critic_while_the_actor_stands_still(base, groups):
    trainer = critic_trainer(base, critic=CriticConfig(warmup_steps=2), ppo_n_minibatches=2)
    before, head = actor_state(trainer), trainer.value_head.linear.weight.detach().clone()
    for step in (1, 2):
        metrics = trainer(Batch(step, groups))
        assert metrics["critic/warmup"] == 1.0 and metrics["critic/grad_norm"] > 0
    after = actor_state(trainer)
    assert all(torch.equal(before[k], after[k]) for k in before)  # bit for bit
    assert not trainer.optimizer.state  # the actor's optimizer was never stepped
    assert not torch.equal(head, trainer.value_head.linear.weight)
    assert trainer.version == 2
    metrics = trainer(Batch(3, groups))
    assert metrics["critic/warmup"] == 0.0
    assert any(not torch.equal(after[k], v) for k, v in actor_state(trainer).items())


def test_a_checkpoint_resumes_the_critic(base, groups, tmp_path):
    trainer = critic_trainer(base, critic=CriticConfig(warmup_steps=1, vf_coef=0.5))
    for step in (1, 2):
        trainer(Batch(step, groups))
    trainer.save(str(tmp_path / "ckpt"))
    assert (tmp_path / "ckpt" / "critic" / "value_head.safetensors").exists()
    expected = trainer(Batch(3, groups))
    resumed = critic_trainer(base, critic=CriticConfig(warmup_steps=1, vf_coef=0.5))
    resumed.load(str(tmp_path / "ckpt"))
    got = resumed(Batch(3, groups))
    for key in ("loss/value", "critic/values_mean", "critic/vpred_mean", "loss/rl", "critic/grad_norm"):
        assert got[key] == pytest.approx(expected[key], abs=1e-6), key
    assert torch.equal(resumed.value_head.linear.weight, trainer.value_head.linear.weight)


def test_a_checkpoint_without_a_critic_is_refused(base, groups, tmp_path):
    plain = TorchTrainer(Policy(str(base), lora=LoraSpec(rank=4, alpha=8.0)))
    plain.save(str(tmp_path / "plain"))
    with pytest.raises(BackendError, match="holds no critic"):
        critic_trainer(base).load(str(tmp_path / "plain"))


def test_a_trainer_without_a_critic_refuses_token_rewards(base, groups):
    plain = TorchTrainer(Policy(str(base), lora=LoraSpec(rank=4, alpha=8.0)))
    with pytest.raises(BackendError, match=f"rollout 0 of row {groups[0].task.id!r} carries token rewards"):
        plain(Batch(1, groups))
