"""The trainer executes credit streams without knowing the algorithm: a batch mixing a grpo group and
an opd group gives exactly the gradient of the two pure batches' components summed (each component
is normalised over its own tokens), whatever the micro-batching."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

import torch  # noqa: E402

from rlvr.algos import GRPO, OPD, SFT  # noqa: E402
from rlvr.backends.model.policy import LoraSpec, Policy  # noqa: E402
from rlvr.backends.model.tiny import build_tiny_model  # noqa: E402
from rlvr.backends.sample.batched import TransformersSampler  # noqa: E402
from rlvr.backends.train.trainer import TorchTrainer  # noqa: E402
from rlvr.data.tasks import load_tasks  # noqa: E402
from rlvr.envs.tasks.arithmetic import make_rows  # noqa: E402
from rlvr.errors import RLVRError  # noqa: E402
from rlvr.testing import batch_of  # noqa: E402


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    base = tmp_path_factory.mktemp("mixed") / "base"
    build_tiny_model(base, hidden=32, layers=2, heads=2, seed=0)
    policy = Policy(str(base), lora=LoraSpec(rank=4), seed=0)
    tasks = load_tasks(make_rows(8, seed=3))
    sampler = TransformersSampler(policy, max_new_tokens=5, temperature=1.0, seed=2)
    groups = sampler(tasks[:4], 2)
    scored = [[dataclasses.replace(r, reward=float(i % 2)) for i, r in enumerate(g)] for g in groups]
    grpo = [GRPO().assign(tasks[i], [[r] for r in scored[i]]) for i in (0, 1)]
    opd = [OPD(None, "t").assign(tasks[i], [[r] for r in scored[i]]) for i in (2, 3)]  # type: ignore[arg-type]
    torch.manual_seed(0)
    opd = [dataclasses.replace(g, rollouts=tuple(
        dataclasses.replace(r, ref_logprobs=tuple((-torch.rand(len(r.completion_ids))).tolist())) for r in g.rollouts))
        for g in opd]
    sft = [SFT({"name": "t"}).assign(tasks[i], [[r] for r in scored[i]]) for i in (2, 3)]
    return policy, [r for g in grpo for r in g.rollouts], [r for g in opd for r in g.rollouts], \
        [r for g in sft for r in g.rollouts]


def gradient(policy, rollouts, micro_batch):
    trainer = TorchTrainer(policy, micro_batch=micro_batch)
    policy.model.zero_grad(set_to_none=True)
    for chunk in trainer._chunks(rollouts):
        trainer._loss(chunk.batch, None, chunk.denominators).loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in policy.model.named_parameters() if p.grad is not None}
    policy.model.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("micro_batch", [16, 3])
@pytest.mark.parametrize("other", ["opd", "sft"])
def test_a_mixed_batch_is_the_sum_of_its_pure_batches(setup, micro_batch, other):
    policy, grpo, opd, sft = setup
    distil = opd if other == "opd" else sft
    mixed = [r for pair in zip(grpo, distil, strict=True) for r in pair]  # interleaved across micro-batches
    together = gradient(policy, mixed, micro_batch)
    apart = [gradient(policy, grpo, micro_batch), gradient(policy, distil, micro_batch)]
    assert together and set(together) == set(apart[0]) == set(apart[1])
    for name, g in together.items():
        torch.testing.assert_close(g, apart[0][name] + apart[1][name], rtol=1e-5, atol=1e-7)
    assert any(g.abs().sum() > 0 for g in apart[1].values())  # the distillation part really pulls


def test_a_mixed_batch_trains_and_reports_every_component(setup):
    policy, grpo, opd, _ = setup
    metrics = TorchTrainer(policy, lr=1e-3)(batch_of(grpo + opd))
    # loss/rl is −mean(A) on-policy, 0 for a symmetric group: its gradient is not; the grad norm shows it
    assert metrics["loss/ref_kl"] != 0.0 and metrics["loss/ce"] == 0.0 and metrics["train/grad_norm"] > 0
    assert metrics["train/optimizer_steps"] == 1.0


def test_a_stream_out_of_step_with_its_tokens_is_refused_naming_the_rollout(setup):
    policy, grpo, opd, _ = setup
    bad = dataclasses.replace(opd[1], ref_logprobs=opd[1].ref_logprobs[:-1])
    with pytest.raises(RLVRError, match=rf"rollout 3 of row {bad.task_id!r}: ref_logprobs has"):
        TorchTrainer(policy)(batch_of([*grpo[:2], opd[0], bad]))
    no_ref = dataclasses.replace(opd[0], ref_logprobs=None)
    with pytest.raises(RLVRError, match="ref_kl tokens but no ref_logprobs"):
        TorchTrainer(policy)(batch_of([no_ref]))


def test_an_algorithm_weight_scales_its_share_of_the_gradient_exactly(setup):
    policy, grpo, opd, _ = setup
    task = load_tasks(make_rows(1, seed=3))[0]
    weighted = [r for g in (OPD(None, "t").with_weight(0.25).credit(  # type: ignore[arg-type]
        task, [[dataclasses.replace(r, ref_kl_weights=None, rl_weights=None)]]) for r in opd) for r in g.rollouts]
    weighted = [dataclasses.replace(w, ref_logprobs=r.ref_logprobs) for w, r in zip(weighted, opd, strict=True)]
    together = gradient(policy, grpo + weighted, 16)
    apart = [gradient(policy, grpo, 16), gradient(policy, opd, 16)]
    for name, g in together.items():
        torch.testing.assert_close(g, apart[0][name] + 0.25 * apart[1][name], rtol=1e-5, atol=1e-7)
