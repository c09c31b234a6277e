"""The torch trainer's schedule and passes: the learning rate of each step (recorded, applied, kept in
the checkpoint so a resume mid-warmup continues the same curve) and ``update_epochs`` passes over one
batch against one old-policy snapshot."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

import torch  # noqa: E402

from rlvr.backends.model.policy import LoraSpec, Policy  # noqa: E402
from rlvr.backends.model.tiny import build_tiny_model  # noqa: E402
from rlvr.backends.train.losses import LossConfig  # noqa: E402
from rlvr.backends.train.trainer import TorchTrainer  # noqa: E402
from rlvr.lr_schedule import LRSchedule, plan_schedule  # noqa: E402
from rlvr.testing import batch_of  # noqa: E402
from rlvr.types import Rollout  # noqa: E402
from support.weights import hand_rollouts  # noqa: E402

pytestmark = pytest.mark.train

ADVANTAGES = [1.0, -1.0, 0.5, -0.5]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "base", hidden=32, layers=2, heads=2, seed=0)


@pytest.fixture(scope="module")
def rollouts(base):
    """Four hand-made completions of two prompts (no sampler involved: the trainer is under test)."""
    tokenizer = Policy(str(base), lora=None, need_reference=False).tokenizer
    return hand_rollouts(tokenizer, {"12+34=": ("46", "47"), "5+7=": ("12", "21")})


def trainer_on(base, **kwargs) -> TorchTrainer:
    return TorchTrainer(Policy(str(base), lora=LoraSpec(rank=4, alpha=8.0), need_reference=False), **kwargs)


def weights(trainer: TorchTrainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.policy.model.named_parameters() if p.requires_grad}


def test_each_step_runs_at_its_scheduled_rate_and_records_it(base, rollouts):
    schedule = plan_schedule("cosine", 6, warmup_steps=2, min_lr_ratio=0.1)
    trainer = trainer_on(base, lr=1e-2, lr_schedule=schedule)
    seen = []
    for step in range(1, 5):
        metrics = trainer(batch_of(rollouts, ADVANTAGES, step))
        seen.append(metrics["train/lr"])
        assert trainer.optimizer.param_groups[0]["lr"] == metrics["train/lr"]
    # 1e-2 x [1/2, 1, 1 (p = 0), 0.1 + 0.9 * (1 + cos(pi / 4)) / 2]
    assert seen == pytest.approx([5e-3, 1e-2, 1e-2, 1e-2 * (0.1 + 0.9 * (1 + 2 ** -0.5) / 2)])


def test_a_resume_mid_warmup_continues_the_same_learning_rate_curve(base, rollouts, tmp_path):
    schedule = plan_schedule("linear", 6, warmup_steps=3)
    full = trainer_on(base, lr=1e-2, lr_schedule=schedule)
    full_lrs = [full(batch_of(rollouts, ADVANTAGES, s))["train/lr"] for s in range(1, 7)]
    first = trainer_on(base, lr=1e-2, lr_schedule=schedule)
    cut_lrs = [first(batch_of(rollouts, ADVANTAGES, s))["train/lr"] for s in (1, 2)]  # killed after step 2 of 3
    first.save(str(tmp_path / "ckpt"))
    # Configured over another horizon (a resume that raised max_steps): the checkpoint's curve wins.
    resumed = trainer_on(base, lr=1e-2, lr_schedule=plan_schedule("linear", 40, warmup_steps=3))
    resumed.load(str(tmp_path / "ckpt"))
    assert resumed.lr_schedule == schedule and resumed.version == 2
    cut_lrs += [resumed(batch_of(rollouts, ADVANTAGES, s))["train/lr"] for s in range(3, 7)]
    assert cut_lrs == full_lrs
    assert full_lrs == pytest.approx([1e-2 / 3, 2e-2 / 3, 1e-2, 1e-2, 1e-2 * 2 / 3, 1e-2 / 3])
    for name, value in weights(full).items():
        torch.testing.assert_close(weights(resumed)[name], value, rtol=0, atol=1e-6)


def test_a_checkpoint_without_a_schedule_keeps_the_configured_one(base, rollouts, tmp_path):
    trainer = trainer_on(base, lr=1e-2)
    trainer(batch_of(rollouts, ADVANTAGES, 1))
    trainer.save(str(tmp_path / "ckpt"))
    state = (tmp_path / "ckpt" / "trainer.json")
    state.write_text(state.read_text().replace(', "lr_schedule"', ', "unused"'))  # as an older checkpoint
    configured = plan_schedule("cosine", 8, warmup_steps=2)
    again = trainer_on(base, lr=1e-2, lr_schedule=configured)
    again.load(str(tmp_path / "ckpt"))
    assert again.lr_schedule == configured and again.describe()["lr_schedule"]["kind"] == "cosine"


def counted(trainer: TorchTrainer) -> list[int]:
    step, calls = trainer.optimizer.step, []

    def counting_step(*args, **kw):
        calls.append(1)
        return step(*args, **kw)

    trainer.optimizer.step = counting_step
    return calls


def test_update_epochs_pass_over_every_minibatch_against_one_snapshot(base, rollouts):
    once = trainer_on(base, lr=5e-2, loss=LossConfig(policy_loss="ppo"))
    calls = counted(once)
    assert once(batch_of(rollouts, ADVANTAGES, 1))["train/ppo_kl"] == 0.0 and len(calls) == 1
    twice = trainer_on(base, lr=5e-2, loss=LossConfig(policy_loss="ppo"), update_epochs=2)
    calls = counted(twice)
    metrics = twice(batch_of(rollouts, ADVANTAGES, 1))
    # Pass 2 is scored against the snapshot taken before pass 1's step (a re-taken one would give 0).
    assert len(calls) == 2 and metrics["train/optimizer_steps"] == 2
    assert abs(metrics["train/ppo_kl"]) > 1e-5
    both = trainer_on(base, lr=5e-2, loss=LossConfig(policy_loss="ppo"), update_epochs=3, ppo_n_minibatches=2)
    calls = counted(both)
    assert both(batch_of(rollouts, ADVANTAGES, 1))["train/optimizer_steps"] == 6 and len(calls) == 6
    assert both.version == 1  # one call is one policy version, whatever the passes


def test_later_passes_clip_against_the_snapshot(base, rollouts):
    """With a large step, pass 2's ratio leaves ppo's clip range: the clip is taken against the
    batch's snapshot, as PPO's epochs do."""
    trainer = trainer_on(base, lr=0.5, loss=LossConfig(policy_loss="ppo", clip_eps_low=0.01, clip_eps_high=0.01),
                         update_epochs=2)
    assert trainer(batch_of(rollouts, ADVANTAGES, 1))["train/clip_frac"] > 0


def test_update_epochs_below_one_is_refused(base):
    with pytest.raises(ValueError, match="update_epochs must be >= 1"):
        trainer_on(base, update_epochs=0)


def test_the_schedule_is_described_with_the_trainer(base):
    described = trainer_on(base, lr=3e-3, lr_schedule=LRSchedule("wsd", 10, 1, 0.0, 2)).describe()
    assert described["lr"] == 3e-3 and described["lr_schedule"]["decay_steps"] == 2
    assert described["update_epochs"] == 1


def masked(rollouts: list[Rollout]) -> list[Rollout]:
    """The rollouts with every completion token masked out (as ``mask_truncated_completions`` does to a
    truncated one)."""
    import dataclasses

    return [dataclasses.replace(r, loss_mask=(0,) * len(r.completion_ids)) for r in rollouts]


def test_a_minibatch_with_no_token_to_train_is_not_stepped(base, rollouts):
    """AdamW would move the weights on a zero gradient (its momentum and weight decay): a minibatch
    whose every token is masked is left out, counted, and the other minibatch still trains."""
    trainer = trainer_on(base, lr=5e-2, weight_decay=0.1, ppo_n_minibatches=2)
    calls = counted(trainer)
    trainer(batch_of(rollouts, ADVANTAGES, 1))  # momentum built up: a zero-gradient step would move weights
    before = weights(trainer)
    metrics = trainer(batch_of(masked(rollouts), ADVANTAGES, 2))
    assert metrics["train/empty_minibatches"] == 2 and metrics["train/optimizer_steps"] == 0
    assert "train/grad_norm" not in metrics and len(calls) == 2 and trainer.version == 2
    assert trainer.consecutive_skips == 0  # nothing non-finite: not a step towards max_nonfinite
    for name, value in weights(trainer).items():
        assert torch.equal(value, before[name]), name
    half = masked(rollouts[:2]) + rollouts[2:]  # the first minibatch is all masked, the second is not
    metrics = trainer(batch_of(half, ADVANTAGES, 3))
    assert metrics["train/empty_minibatches"] == 1 and metrics["train/optimizer_steps"] == 1 and len(calls) == 3
    assert any(not torch.equal(value, before[name]) for name, value in weights(trainer).items())
