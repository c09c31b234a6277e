"""The in-process seams on a real (tiny) model: sampler, trainer, checkpoints, evaluator."""

from __future__ import annotations

import dataclasses
import math

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

import torch  # noqa: E402

from rlvr.backends.model.io import load_model  # noqa: E402
from rlvr.backends.model.policy import LoraSpec, Policy  # noqa: E402
from rlvr.backends.model.tiny import build_tiny_model  # noqa: E402
from rlvr.backends.sample.batched import TransformersSampler, processed_token_logprobs, sample_batch  # noqa: E402
from rlvr.backends.train.losses import LossConfig  # noqa: E402
from rlvr.backends.train.trainer import TorchTrainer, completion_logprobs, pack  # noqa: E402
from rlvr.data.tasks import load_tasks  # noqa: E402
from rlvr.envs.tasks.arithmetic import make_rows, reward_fn  # noqa: E402
from rlvr.errors import BackendError  # noqa: E402
from rlvr.run.evaluation import SamplingEvaluator  # noqa: E402
from rlvr.testing import batch_of  # noqa: E402
from rlvr.types import SamplingParams, StopReason  # noqa: E402

pytestmark = pytest.mark.train


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "base", hidden=32, layers=2, heads=2, seed=0)


@pytest.fixture(scope="module")
def tasks():
    return load_tasks(make_rows(8, seed=3))


def lora_policy(base, rank=4):
    return Policy(str(base), lora=LoraSpec(rank=rank, alpha=8.0))


def test_sampler_returns_aligned_rollouts_stamped_with_the_version(base, tasks):
    policy = lora_policy(base)
    policy.version = 5
    sampler = TransformersSampler(policy, max_new_tokens=4, temperature=1.0, seed=0)
    groups = sampler(tasks[:3], 2)
    assert [len(g) for g in groups] == [2, 2, 2]
    for task, group in zip(tasks[:3], groups, strict=True):
        for r in group:
            assert r.task_id == task.id and r.version == 5
            assert len(r.logprobs) == len(r.completion_ids) <= 4
            assert all(lp <= 0 and math.isfinite(lp) for lp in r.logprobs)
            eos_seen = policy.tokenizer.eos_token_id in r.completion_ids
            assert r.stop_reason == (StopReason.STOP if eos_seen else StopReason.LENGTH)
            assert r.messages[-1] == {"role": "assistant", "content": r.text}
            assert list(r.prompt_ids) == sampler.prompt_ids(task)


def test_sampler_logprobs_match_the_trainers_logprobs(base, tasks):
    policy = lora_policy(base)
    sampler = TransformersSampler(policy, max_new_tokens=4, temperature=0.7, seed=1)
    rollouts = [r for g in sampler(tasks[:4], 2) for r in g]
    batch = pack(batch_of(rollouts, [0.0] * len(rollouts)).rollouts, policy.tokenizer.pad_token_id, "cpu")
    with torch.no_grad():
        logp = completion_logprobs(policy.model, batch, temperature=0.7)
    for b, r in enumerate(rollouts):
        got = logp[b, : len(r.completion_ids)]
        assert torch.allclose(got, torch.tensor(r.logprobs), atol=1e-4), r


def test_sampling_is_seeded_by_version_and_seed(base, tasks):
    policy = lora_policy(base)

    def texts(seed, version):
        policy.version = version
        return [r.text for g in TransformersSampler(policy, max_new_tokens=4, seed=seed)(tasks, 2) for r in g]

    assert texts(0, 1) == texts(0, 1)
    assert texts(0, 1) != texts(0, 2)
    assert texts(0, 1) != texts(1, 1)


def _rollouts(policy, tasks, k=4, seed=0):
    sampler = TransformersSampler(policy, max_new_tokens=4, temperature=1.0, seed=seed)
    return [r for g in sampler(tasks, k) for r in g]


def test_a_step_updates_only_the_adapter_and_bumps_the_version(base, tasks):
    policy = lora_policy(base)
    frozen = {n: p.detach().clone() for n, p in policy.model.named_parameters() if not p.requires_grad}
    trainable = {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}
    trainer = TorchTrainer(policy, lr=1e-2)
    rollouts = _rollouts(policy, tasks)
    advantages = [1.0 if i % 2 else -1.0 for i in range(len(rollouts))]
    metrics = trainer(batch_of(rollouts, advantages, 1))
    assert policy.version == 1 and math.isfinite(metrics["loss/total"])
    changed = [n for n, p in policy.model.named_parameters() if p.requires_grad and not torch.equal(p, trainable[n])]
    assert changed, "no adapter weight moved"
    assert all(torch.equal(p, frozen[n]) for n, p in policy.model.named_parameters() if not p.requires_grad)


def test_positive_advantage_raises_the_likelihood_of_its_completion(base, tasks):
    policy = lora_policy(base)
    trainer = TorchTrainer(policy, lr=5e-3)
    rollouts = _rollouts(policy, tasks[:2], k=2)
    advantages = [1.0, -1.0, 1.0, -1.0]
    batch = pack(batch_of(rollouts, [0.0] * len(rollouts)).rollouts, policy.tokenizer.pad_token_id, "cpu")
    with torch.no_grad():
        before = completion_logprobs(policy.model, batch, 1.0).sum(1)
    for step in range(1, 4):
        trainer(batch_of(rollouts, advantages, step))
    with torch.no_grad():
        after = completion_logprobs(policy.model, batch, 1.0).sum(1)
    assert after[0] > before[0] and after[2] > before[2]
    assert after[1] < before[1] and after[3] < before[3]


def test_reference_is_the_base_with_the_adapter_disabled(base, tasks):
    policy = lora_policy(base)
    trainer = TorchTrainer(policy, lr=5e-2, loss=LossConfig(kl_coef=0.1))
    rollouts = _rollouts(policy, tasks[:2], k=2)
    metrics = trainer(batch_of(rollouts, [1.0, -1.0, 1.0, -1.0], 1))
    assert "train/kl" in metrics
    batch = pack(batch_of(rollouts, [0.0] * len(rollouts)).rollouts, policy.tokenizer.pad_token_id, "cpu")
    plain = load_model(str(base))
    with torch.no_grad(), policy.as_reference() as ref:
        ref_logp = completion_logprobs(ref, batch, 1.0)
        base_logp = completion_logprobs(plain, batch, 1.0)
    with torch.no_grad():
        live_logp = completion_logprobs(policy.model, batch, 1.0)
    assert torch.allclose(ref_logp, base_logp, atol=1e-5)
    assert not torch.allclose(live_logp, base_logp, atol=1e-5)


def test_full_fine_tune_keeps_a_frozen_reference_snapshot(base, tasks):
    policy = Policy(str(base), lora=None, need_reference=True, reference_on_cpu=True)
    assert not policy.is_lora and policy.reference is not None
    snapshot = {n: p.clone() for n, p in policy.reference.named_parameters()}
    trainer = TorchTrainer(policy, lr=1e-2, loss=LossConfig(kl_coef=0.05))
    rollouts = _rollouts(policy, tasks[:2], k=2)
    trainer(batch_of(rollouts, [1.0, -1.0, 1.0, -1.0], 1))
    assert all(torch.equal(p, snapshot[n]) for n, p in policy.reference.named_parameters())
    moved = any(not torch.equal(p, snapshot[n]) for n, p in policy.model.named_parameters())
    assert moved


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_save_then_load_continues_bit_for_bit(base, tasks, tmp_path, lora):
    def fresh():
        policy = lora_policy(base) if lora else Policy(str(base), lora=None, need_reference=False)
        return policy, TorchTrainer(policy, lr=1e-2)

    advantages = [1.0, -1.0] * 4
    policy_a, trainer_a = fresh()
    rollouts = _rollouts(policy_a, tasks[:2])
    trainer_a(batch_of(rollouts, advantages, 1))
    trainer_a.save(str(tmp_path / "ckpt"))
    trainer_a(batch_of(rollouts, advantages, 2))

    policy_b, trainer_b = fresh()
    trainer_b.load(str(tmp_path / "ckpt"))
    assert policy_b.version == 1
    trainer_b(batch_of(rollouts, advantages, 2))
    a = dict(policy_a.model.named_parameters())
    for name, p in policy_b.model.named_parameters():
        assert torch.equal(p, a[name]), name


def test_non_finite_steps_are_skipped_counted_and_then_fatal(base, tasks):
    policy = lora_policy(base)
    trainer = TorchTrainer(policy, lr=1e-2, max_nonfinite=2)
    rollouts = _rollouts(policy, tasks[:1], k=2)
    before = {n: p.clone() for n, p in policy.model.named_parameters() if p.requires_grad}
    metrics = trainer(batch_of(rollouts, [float("nan"), 1.0], 1))
    assert metrics["train/skipped"] == 1.0 and metrics["train/nonfinite_skips"] == 1
    assert all(torch.equal(p, before[n]) for n, p in policy.model.named_parameters() if p.requires_grad)
    trainer(batch_of(rollouts, [1.0, -1.0], 2))  # a good step resets the consecutive count
    trainer(batch_of(rollouts, [float("inf"), 1.0], 3))
    with pytest.raises(BackendError, match="non-finite"):
        trainer(batch_of(rollouts, [float("nan"), 1.0], 4))


def test_sampling_evaluator_scores_greedy_completions(base, tasks):
    policy = lora_policy(base)
    greedy = TransformersSampler(policy, max_new_tokens=4, temperature=0.0)
    report = SamplingEvaluator(greedy, reward_fn)(0, tasks)
    assert report.n == len(tasks) and set(report.per_task) == {t.id for t in tasks}
    assert report.score == sum(report.per_task.values()) / len(tasks)
    assert SamplingEvaluator(greedy, reward_fn)(0, tasks).per_task == report.per_task  # greedy: stable


def test_entropy_bonus_is_computed_and_reported(base, tasks):
    policy = lora_policy(base)
    trainer = TorchTrainer(policy, lr=1e-3, loss=LossConfig(entropy_coef=0.01))
    rollouts = _rollouts(policy, tasks[:2], k=2)
    metrics = trainer(batch_of(rollouts, [1.0, -1.0, 1.0, -1.0], 1))
    vocab = len(policy.tokenizer)
    assert 0 < metrics["train/entropy"] <= math.log(vocab) + 1e-4


def test_settings_name_exactly_the_losses_the_library_has():
    from typing import get_args

    from rlvr.backends.train.losses import AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES
    from rlvr.config.run import TrainSection

    fields = TrainSection.model_fields
    names, custom = get_args(fields["policy_loss"].annotation)  # a built-in name, or an import spec
    assert set(get_args(names)) == set(POLICY_LOSSES) and custom is str
    modes, unset = get_args(fields["aggregation"].annotation)  # None: the policy loss's default
    assert set(get_args(modes)) == set(AGGREGATIONS) and unset is type(None)
    assert set(get_args(fields["kl_estimator"].annotation)) == set(KL_ESTIMATORS)


def test_bad_loss_combination_fails_naming_the_train_key():
    from rlvr.config.run import load_run_config
    from rlvr.errors import ConfigError
    from rlvr.wiring.levers import loss_config

    cfg = load_run_config(None, ["--train.aggregation=constant"])
    with pytest.raises(ConfigError, match="train.constant_normaliser"):
        loss_config(cfg)


def test_lora_init_is_seeded(base):
    a = dict(lora_policy(base).model.named_parameters())
    b = dict(lora_policy(base).model.named_parameters())
    names = [n for n in a if "lora_A" in n]
    assert names and all(torch.equal(a[n], b[n]) for n in names)
    c = dict(Policy(str(base), lora=LoraSpec(rank=4, alpha=8.0), seed=1).model.named_parameters())
    assert not all(torch.equal(a[n], c[n]) for n in names)


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_micro_batches_give_the_full_batch_gradient(base, tasks, aggregation):
    grads = []
    for micro in (64, 3):
        policy = lora_policy(base)
        trainer = TorchTrainer(policy, lr=1e-2, micro_batch=micro, loss=LossConfig(aggregation=aggregation))
        # Plain SGD at lr 1: the update is exactly minus the gradient (Adam would normalise it away).
        trainer.optimizer = torch.optim.SGD(policy.trainable_parameters(), lr=1.0)
        # Ragged lengths, so chunks differ in tokens per sequence.
        rollouts = [dataclasses.replace(r, completion_ids=r.completion_ids[:n], logprobs=r.logprobs[:n])
                    for r, n in zip(_rollouts(policy, tasks[:2], k=4, seed=5), [4, 1, 4, 1, 2, 4, 1, 3], strict=True)]
        trainer(batch_of(rollouts, [1.0, -1.0, 0.5, -0.5, 1.0, 0.0, -1.0, 0.25], 1))
        grads.append({n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad})
    for name, value in grads[0].items():
        assert torch.allclose(value, grads[1][name], atol=1e-6), name


@pytest.mark.parametrize("params", [
    SamplingParams(max_tokens=6, temperature=0.8, top_k=5),
    SamplingParams(max_tokens=6, temperature=1.2, min_p=0.05, repetition_penalty=1.3),
    SamplingParams(max_tokens=6, temperature=1.0, top_p=0.7),
    SamplingParams(max_tokens=6, temperature=0.0, repetition_penalty=1.5),
], ids=["top_k", "min_p+penalty", "top_p", "greedy+penalty"])
def test_recorded_logprobs_are_those_of_the_distribution_sampled_from(base, params):
    policy = lora_policy(base)
    prompts = [[9, 10, 80, 11], [12, 13], [9, 10, 80, 11, 40, 41]]
    outs = sample_batch(policy.model, prompts, params, seed=[1, 2, 3], eos_ids=policy.eos_ids,
                        pad_id=policy.tokenizer.pad_token_id)
    for prompt, out in zip(prompts, outs, strict=True):
        want = processed_token_logprobs(policy.model, prompt, out.ids, params)
        assert all(math.isfinite(lp) for lp in want)  # every sampled token is inside the kept set
        assert out.logprobs == pytest.approx(want, abs=1e-4)


def test_a_model_folders_generation_defaults_do_not_reshape_the_draw(base):
    policy = lora_policy(base)
    params = SamplingParams(max_tokens=6, temperature=1.0)
    kw = {"seed": [4], "eos_ids": policy.eos_ids, "pad_id": policy.tokenizer.pad_token_id}
    plain = sample_batch(policy.model, [[9, 10, 80, 11]], params, **kw)[0]
    defaults = policy.model.generation_config
    defaults.repetition_penalty, defaults.no_repeat_ngram_size, defaults.min_new_tokens = 5.0, 1, 6
    try:
        assert sample_batch(policy.model, [[9, 10, 80, 11]], params, **kw)[0] == plain
    finally:
        defaults.repetition_penalty, defaults.no_repeat_ngram_size, defaults.min_new_tokens = None, None, None


def test_a_completion_depends_on_its_own_seed_not_on_its_batch(base):
    policy = lora_policy(base)
    params = SamplingParams(max_tokens=6, temperature=1.0)
    prompts = [[9, 10, 80, 11], [12, 13], [9, 10, 80, 11, 40, 41]]
    kw = {"eos_ids": policy.eos_ids, "pad_id": policy.tokenizer.pad_token_id}
    alone = sample_batch(policy.model, prompts[:1], params, seed=[77], **kw)[0]
    batched = sample_batch(policy.model, prompts, params, seed=[77, 5, 6], **kw)[0]
    reordered = sample_batch(policy.model, prompts[::-1], params, seed=[6, 5, 77], **kw)[2]
    assert alone.ids == batched.ids == reordered.ids
    assert batched.logprobs == pytest.approx(alone.logprobs, abs=1e-4)
    others = {sample_batch(policy.model, prompts[:1], params, seed=[s], **kw)[0].ids for s in range(78, 86)}
    assert len(others | {alone.ids}) > 1  # and the seed does decide the draw
