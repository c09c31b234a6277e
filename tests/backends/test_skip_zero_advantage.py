"""``skip_zero_advantage``: rows that cannot move the weights are not read, and the step is the one
that reading them gives (their tokens still count in the normaliser)."""

from __future__ import annotations

import dataclasses
import math

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

import torch  # noqa: E402

from rlvr.backends.model.policy import LoraSpec, Policy  # noqa: E402
from rlvr.backends.model.tiny import build_tiny_model  # noqa: E402
from rlvr.backends.train.losses import LossConfig  # noqa: E402
from rlvr.backends.train.trainer import TorchTrainer, carries_loss  # noqa: E402
from rlvr.testing import batch_of  # noqa: E402
from support.weights import hand_rollouts  # noqa: E402

pytestmark = pytest.mark.train

# Four groups of two: two groups whose samples scored apart, two whose samples scored alike.
MIXED = [1.0, -1.0, 0.0, 0.0, 0.5, -0.5, 0.0, 0.0]
ALIKE = [0.0] * 8


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "base", hidden=32, layers=2, heads=2, seed=0)


@pytest.fixture(scope="module")
def rollouts(base):
    tokenizer = Policy(str(base), lora=None, need_reference=False).tokenizer
    return hand_rollouts(tokenizer, {"12+34=": ("46", "47"), "5+7=": ("12", "21"), "8+8=": ("16", "61"),
                                     "40+2=": ("42", "24")})


def trainer_on(base, **kwargs) -> tuple[TorchTrainer, list[int]]:
    """A LoRA trainer (the adapter's init is seeded: two of them start equal) and the row count of
    every forward-backward it runs."""
    trainer = TorchTrainer(Policy(str(base), lora=LoraSpec(rank=4, alpha=8.0), need_reference=False), lr=1e-2,
                           weight_decay=0.1, micro_batch=3, **kwargs)
    rows: list[int] = []
    forward = trainer._logprobs

    def counted(model, batch, with_entropy=False):
        rows.append(len(batch["rollouts"]))
        return forward(model, batch, with_entropy=with_entropy)

    trainer._logprobs = counted  # type: ignore[method-assign]
    return trainer, rows


def weights(trainer: TorchTrainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.policy.model.named_parameters() if p.requires_grad}


def assert_same_weights(a: TorchTrainer, b: TorchTrainer) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for name in wa:
        assert torch.allclose(wa[name], wb[name], atol=1e-6, rtol=0), name
    assert any(not torch.equal(w, torch.zeros_like(w)) for n, w in wa.items() if "lora_B" in n)  # they moved


@pytest.mark.parametrize("loss", [LossConfig(), LossConfig(policy_loss="ppo"),
                                  LossConfig(policy_loss="gspo"), LossConfig(policy_loss="cispo")],
                         ids=["grpo", "ppo", "gspo", "cispo"])
def test_rows_of_zero_advantage_are_not_read_and_the_weights_move_as_if_they_were(base, rollouts, loss):
    skipping, read = trainer_on(base, loss=loss)
    reading, read_all = trainer_on(base, loss=loss, skip_zero_advantage=False)
    for step in (1, 2):
        out = skipping(batch_of(rollouts, MIXED, step=step))
        ref = reading(batch_of(rollouts, MIXED, step=step))
        assert out["train/optimizer_steps"] == ref["train/optimizer_steps"] == 1
        assert math.isclose(out["loss/rl"], ref["loss/rl"], rel_tol=1e-5, abs_tol=1e-7)
    assert sum(read) == 2 * 4 and sum(read_all) == 2 * 8  # the rows of the scored-alike groups were left out
    assert_same_weights(skipping, reading)


def test_a_minibatch_of_only_zero_advantages_still_steps_adam_on_its_zero_gradient(base, rollouts):
    skipping, read = trainer_on(base)
    reading, _ = trainer_on(base, skip_zero_advantage=False)
    for trainer in (skipping, reading):
        trainer(batch_of(rollouts, MIXED, step=1))  # momentum to carry
        before = weights(trainer)
        trainer(batch_of(rollouts, ALIKE, step=2))
        moved = weights(trainer)
        assert any(not torch.equal(before[n], moved[n]) for n in before)  # momentum and decay moved them
    assert read[-1] == 1  # one row read: the zero gradient AdamW steps on
    assert_same_weights(skipping, reading)


@pytest.mark.parametrize("loss", [LossConfig(policy_loss="dro"), LossConfig(policy_loss="dppo"),
                                  LossConfig(entropy_coef=0.01)], ids=["dro", "dppo", "entropy"])
def test_a_loss_that_moves_the_weights_at_zero_advantage_reads_every_row(base, rollouts, loss):
    trainer, read = trainer_on(base, loss=loss)
    trainer(batch_of(rollouts, MIXED))
    assert sum(read) == 8


def test_a_token_export_reads_every_row(base, rollouts):
    trainer, read = trainer_on(base)
    trainer.token_export = type("On", (), {"on": True, "begin": lambda *a: None, "at": lambda *a: None,
                                           "add": lambda *a: None, "finish": lambda *a: None})()
    trainer(batch_of(rollouts, MIXED))
    assert sum(read) == 8


def test_what_carries_loss(rollouts):
    r = batch_of(rollouts[:1], [0.0]).rollouts[0]
    n = len(r.completion_ids)
    assert not carries_loss(r)
    assert carries_loss(dataclasses.replace(r, advantages=(0.0,) * (n - 1) + (0.3,)))
    assert carries_loss(dataclasses.replace(r, advantages=(math.nan,) * n))  # the non-finite guard still sees it
    # an advantage on a token outside the rl weights counts for nothing
    assert not carries_loss(dataclasses.replace(r, advantages=(0.5,) + (0.0,) * (n - 1),
                                                rl_weights=(0.0,) + (1.0,) * (n - 1)))
    assert carries_loss(dataclasses.replace(r, ce_weights=(1.0,) * n))
    assert carries_loss(dataclasses.replace(r, ref_kl_weights=(1.0,) * n, ref_logprobs=(0.0,) * n))
    assert carries_loss(dataclasses.replace(r, advantages=None, token_rewards=(0.0,) * n))
    assert not carries_loss(dataclasses.replace(r, advantages=None, rl_weights=(0.0,) * n))
