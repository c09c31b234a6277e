"""The PPO inner loop of the torch trainer: K minibatch steps against one old-policy snapshot."""

from __future__ import annotations

import dataclasses
import math

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

import torch  # noqa: E402

from rlvr.backends.model.policy import LoraSpec, Policy  # noqa: E402
from rlvr.backends.model.tiny import build_tiny_model  # noqa: E402
from rlvr.backends.sample.batched import TransformersSampler  # noqa: E402
from rlvr.backends.train.losses import LossConfig  # noqa: E402
from rlvr.backends.train.trainer import TorchTrainer, _splits  # noqa: E402
from rlvr.data.tasks import load_tasks  # noqa: E402
from rlvr.envs.tasks.arithmetic import make_rows  # noqa: E402
from rlvr.errors import BackendError, ConfigError  # noqa: E402
from rlvr.testing import batch_of  # noqa: E402

pytestmark = pytest.mark.train

ADVANTAGES = [1.0, -1.0, 0.5, -0.5, 1.0, -1.0, 0.5, -0.5]
# Minibatch 1 repeats minibatch 0 with negative advantages: minibatch 0's step must lower the
# log-probs of exactly the tokens minibatch 1 scores, so the sign of ppo_kl (and a clip at a big
# lr) does not hang on how an update on other data happens to generalise.
PUSH_DOWN = [-1.0, -0.5, -1.0, -0.5] * 2


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "base", hidden=32, layers=2, heads=2, seed=0)


@pytest.fixture(scope="module")
def rollouts(base):
    policy = Policy(str(base), lora=LoraSpec(rank=4, alpha=8.0))
    tasks = load_tasks(make_rows(8, seed=3))[:2]
    sampler = TransformersSampler(policy, max_new_tokens=4, temperature=1.0, seed=0)
    return [r for g in sampler(tasks, 4) for r in g]


def counted_trainer(base, **kwargs):
    """A trainer over a fresh LoRA policy whose optimizer counts its ``step`` calls."""
    trainer = TorchTrainer(Policy(str(base), lora=LoraSpec(rank=4, alpha=8.0)), **kwargs)
    step, calls = trainer.optimizer.step, []

    def counting_step(*args, **kw):
        calls.append(1)
        return step(*args, **kw)

    trainer.optimizer.step = counting_step
    return trainer, calls


def adapter(trainer):
    return {n: p.detach().clone() for n, p in trainer.policy.model.named_parameters() if p.requires_grad}


def test_one_minibatch_is_on_policy_with_one_step(base, rollouts):
    trainer, calls = counted_trainer(base, lr=1e-2, ppo_n_minibatches=1)
    metrics = trainer(batch_of(rollouts, ADVANTAGES, 1))
    assert abs(metrics["train/ppo_kl"]) < 1e-6
    assert len(calls) == 1 and metrics["train/optimizer_steps"] == 1
    assert trainer.version == 1 and metrics["train/skipped"] == 0
    # The sampler drew these with the same weights: the mismatch is only float noise.
    assert 0 <= metrics["train/mean_kl"] < 1e-6


def test_two_minibatches_take_two_steps_against_the_snapshot(base, rollouts):
    trainer, calls = counted_trainer(base, lr=1e-2, ppo_n_minibatches=2)
    metrics = trainer(batch_of(rollouts[:4] * 2, PUSH_DOWN, 1))
    # Minibatch 1 is scored against the pre-update snapshot after minibatch 0's step moved the
    # policy (an on-policy or re-taken old_logp would give exactly 0).
    assert metrics["train/ppo_kl"] > 1e-4
    assert len(calls) == 2 and metrics["train/optimizer_steps"] == 2
    assert trainer.version == 1
    trainer(batch_of(rollouts, ADVANTAGES, 2))
    assert trainer.version == 2 and len(calls) == 4


def test_minibatches_are_contiguous_and_cover_the_batch():
    assert [(s.start, s.stop) for s in _splits(10, 3)] == [(0, 4), (4, 7), (7, 10)]
    assert [(s.start, s.stop) for s in _splits(3, 5)] == [(0, 1), (1, 2), (2, 3)]


@pytest.mark.parametrize("policy_loss", ["ppo", "grpo"])
def test_clip_fraction_shows_up_for_clipped_losses_only(base, rollouts, policy_loss):
    trainer, _ = counted_trainer(base, lr=5e-2, ppo_n_minibatches=2, loss=LossConfig(policy_loss=policy_loss))
    metrics = trainer(batch_of(rollouts[:4] * 2, PUSH_DOWN, 1))
    # ppo_kl ≈ mean(d²)/2: above 5e-3 the typical |d| passes 0.1, far enough for a clip to be possible.
    assert metrics["train/ppo_kl"] > 5e-3
    if policy_loss == "ppo":
        assert metrics["train/ppo_clip_frac"] > 0
    else:
        assert metrics["train/ppo_clip_frac"] == 0


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_micro_batches_inside_minibatches_give_the_same_updates(base, rollouts, aggregation):
    # Ragged lengths, so micro-batches differ in tokens per sequence.
    ragged = [dataclasses.replace(r, completion_ids=r.completion_ids[:n], logprobs=r.logprobs[:n])
              for r, n in zip(rollouts, [4, 1, 4, 1, 2, 4, 1, 3], strict=True)]
    params = []
    for micro in (64, 3):
        trainer, _ = counted_trainer(base, micro_batch=micro, ppo_n_minibatches=2,
                                     loss=LossConfig(aggregation=aggregation))
        # Plain SGD: the update is the gradient itself, so any mis-weighting shows.
        trainer.optimizer = torch.optim.SGD(trainer.policy.trainable_parameters(), lr=1.0)
        trainer(batch_of(ragged, ADVANTAGES, 1))
        params.append(adapter(trainer))
    for name, value in params[0].items():
        assert torch.allclose(value, params[1][name], atol=1e-6), name


def test_tis_cap_and_minibatches_flow_from_the_toml_into_the_trainer(base, tmp_path, rollouts):
    from rlvr.config.run import load_run_config
    from rlvr.envs.tasks.arithmetic import reward_fn
    from rlvr.wiring.levers import loss_config
    from rlvr.wiring.plan import RunPlan
    from rlvr.wiring.seams import build_seams

    path = tmp_path / "run.toml"
    path.write_text("[loop]\nlora_rank = 4\n\n[train]\ntis_cap = 2.0\nppo_n_minibatches = 2\n")
    cfg = load_run_config(path)
    assert loss_config(cfg).tis_cap == 2.0
    trainer = build_seams(RunPlan(cfg, {None: reward_fn}), base).trainer
    assert trainer.loss.tis_cap == 2.0 and trainer.ppo_n_minibatches == 2
    assert loss_config(load_run_config(None)).tis_cap is None
    # A sampler that put e^3 less mass on every token than the trainer: every weight hits the cap.
    shifted = [dataclasses.replace(r, logprobs=[lp - 3.0 for lp in r.logprobs]) for r in rollouts]
    metrics = trainer(batch_of(shifted, ADVANTAGES, 1))
    assert metrics["train/tis_clip_frac"] == 1.0 and metrics["train/tis_weight"] == pytest.approx(2.0)
    assert metrics["train/mean_kl"] > 1.0  # k3 of a 3-nat log-ratio: e^-3 + 3 - 1
    assert metrics["train/optimizer_steps"] == 2


@pytest.mark.parametrize("override", ["--train.tis_cap=0.0", "--train.ppo_n_minibatches=0"])
def test_bad_ppo_settings_fail_naming_the_key(override):
    from rlvr.config.run import load_run_config

    key = override.removeprefix("--train.").split("=")[0]
    with pytest.raises(ConfigError, match=key):
        load_run_config(None, [override])


def test_a_non_finite_minibatch_is_skipped_and_counted(base, rollouts):
    trainer, calls = counted_trainer(base, lr=1e-2, ppo_n_minibatches=2, max_nonfinite=2)
    before = adapter(trainer)
    poisoned = ADVANTAGES[:4] + [float("nan")] + ADVANTAGES[5:]  # only in minibatch 1
    metrics = trainer(batch_of(rollouts, poisoned, 1))
    assert len(calls) == 1 and metrics["train/optimizer_steps"] == 1
    assert metrics["train/skipped"] == 1 and metrics["train/nonfinite_skips"] == 1
    assert all(math.isfinite(v) for v in metrics.values())  # averaged over the applied minibatch only
    assert trainer.version == 1 and trainer.consecutive_skips == 0
    assert any(not torch.equal(p, before[n]) for n, p in adapter(trainer).items())
    # A batch with no finite minibatch at all: no update, still one version, one consecutive skip.
    after_first = adapter(trainer)
    metrics = trainer(batch_of(rollouts, [float("nan")] * 8, 2))
    assert metrics["train/optimizer_steps"] == 0 and metrics["train/skipped"] == 2
    assert metrics["train/nonfinite_skips"] == 3 and trainer.consecutive_skips == 1 and trainer.version == 2
    assert all(torch.equal(p, after_first[n]) for n, p in adapter(trainer).items())
    # max_nonfinite counts batches that made no progress, not skipped minibatches.
    with pytest.raises(BackendError, match="non-finite"):
        trainer(batch_of(rollouts, [float("nan")] * 8, 3))
