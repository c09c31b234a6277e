"""Ulysses sequence parallelism (``train.sequence_parallel``) on real processes (gloo on loopback):
two ranks, each running the tiny model on half of every sequence, give the one-process log-probs and
gradients, and train the same weights, within tolerances derived from float32 arithmetic."""

from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from support.dp_rig import (  # noqa: E402
    UNIT_ROUNDOFF,
    free_port,
    make_batch,
    make_trainer,
    max_diff,
    one_rank,
    parity_tolerance,
    spawn_ranks,
    weights,
)

pytestmark = [pytest.mark.train]

SHAPE = {"ppo_n_minibatches": 2, "micro_batch": 2, "max_grad_norm": 0.05}
CALLS = 3


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from rlvr.backends.model.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "base", hidden=32, layers=2, heads=2, seed=0)


def forward_tolerance(base, batch) -> float:
    """How far apart (relative to the largest value) two float32 computations of the same log-probs or
    gradients may land when only their sums are ordered differently (each rank's GEMMs over fewer rows,
    attention over gathered heads): each value is a chain of sums of at most ``terms`` products, so the
    two orders agree within 2·γ_terms·κ (Higham ch. 4), with κ <= 100 as in ``parity_tolerance``."""
    import json

    config = json.loads((base / "config.json").read_text())
    width = max(config["hidden_size"], config["intermediate_size"], config["vocab_size"])
    positions = sum(len(r.prompt_ids) + len(r.completion_ids) for r in batch.rollouts)
    terms = positions + 2 * config["num_hidden_layers"] * width
    gamma = terms * UNIT_ROUNDOFF / (1 - terms * UNIT_ROUNDOFF)
    return 2 * gamma * 100.0


def _logprob_rank(rank: int, world: int, port: int, base, out) -> None:
    import torch

    from rlvr.backends.train.distributed import Ranks, RankTrainer, start_ranks
    from rlvr.backends.train.sequence_parallel import check_model, install, split_completion_logprobs
    from rlvr.backends.train.trainer import pack

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    start_ranks(Ranks(rank, world, rank, ""), "cpu")
    trainer = make_trainer(base, False, RankTrainer)
    check_model(trainer.policy.model, world)
    install(trainer.policy.model)
    rollouts = make_batch(shared_prompts=False).rollouts
    batch = pack(rollouts, trainer.policy.tokenizer.pad_token_id, "cpu")
    logp, entropy = split_completion_logprobs(trainer.policy.model, batch, 0.7, None, with_entropy=True)
    weight = torch.linspace(-1, 1, logp.numel()).view_as(logp)
    ((logp * weight).sum() + 0.1 * entropy.sum()).backward()
    trainer._sum_gradients()
    grads = {n: p.grad.clone() for n, p in trainer.policy.model.named_parameters() if p.requires_grad}
    torch.save({"logp": logp.detach(), "entropy": entropy.detach(), "grads": grads}, out / f"rank{rank}.pt")
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


@pytest.mark.slow
def test_two_ranks_give_the_one_process_logprobs_and_gradients(base, tmp_path):
    import torch

    from rlvr.backends.train.trainer import completion_logprobs, pack

    torch.multiprocessing.spawn(_logprob_rank, args=(2, free_port(), base, tmp_path), nprocs=2)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    trainer = make_trainer(base, False)
    batch_ = make_batch(shared_prompts=False)
    batch = pack(batch_.rollouts, trainer.policy.tokenizer.pad_token_id, "cpu")
    logp, entropy = completion_logprobs(trainer.policy.model, batch, 0.7, with_entropy=True)
    weight = torch.linspace(-1, 1, logp.numel()).view_as(logp)
    ((logp * weight).sum() + 0.1 * entropy.sum()).backward()
    logp, entropy = logp.detach(), entropy.detach()
    grads = {n: p.grad for n, p in trainer.policy.model.named_parameters() if p.requires_grad}
    rel = forward_tolerance(base, batch_)

    for got in ranks:  # every rank holds the whole [B, C] log-probs and the summed gradient
        assert float((got["logp"] - logp).abs().max()) <= rel * float(logp.abs().max())
        assert float((got["entropy"] - entropy).abs().max()) <= rel * float(entropy.abs().max())
        scale = max(float(g.abs().max()) for g in grads.values())
        assert max_diff(got["grads"], grads) <= rel * scale
    # Not vacuous: a per-rank gradient left unsummed (half the positions' part) lands far outside.
    assert max_diff(ranks[0]["grads"], {n: g / 2 for n, g in grads.items()}) > 10 * rel * scale
    print(f"sp=2 vs one process: logp {float((ranks[0]['logp'] - logp).abs().max()):.2e}, gradient "
          f"{max_diff(ranks[0]['grads'], grads):.2e} (tolerance {rel:.2e} x {scale:.2f})")


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_two_sequence_parallel_ranks_train_what_one_process_trains(base, lora, tmp_path):
    batch = make_batch()
    ranks = spawn_ranks(2, base, lora, [("train", batch)] * CALLS, tmp_path, sequence_parallel=2, **SHAPE)
    reference, metrics = one_rank(base, lora, [batch] * CALLS, share_prompts=False, **SHAPE)
    tolerance = parity_tolerance(base, [batch], CALLS * SHAPE["ppo_n_minibatches"])

    assert max_diff(weights(reference), weights(make_trainer(base, lora))) > 10 * tolerance  # the weights moved
    assert max_diff(ranks[0]["weights"], weights(reference)) < tolerance
    assert max_diff(ranks[1]["weights"], ranks[0]["weights"]) == 0.0  # replicas stay identical
    for got, want in zip(ranks[0]["metrics"], metrics, strict=True):
        assert got.keys() == want.keys()
        assert all(got[k] == pytest.approx(want[k], rel=1e-4, abs=1e-6) for k in want), got


def test_sequence_parallel_refusals_name_the_key(base):
    from pydantic import ValidationError

    from rlvr.backends.train.sequence_parallel import check_model
    from rlvr.config.run import RunConfig
    from rlvr.errors import BackendError

    for train in ({"sequence_parallel": 2, "packing": True}, {"sequence_parallel": 2, "micro_batch": "auto"},
                  {"sequence_parallel": 2, "tensor_parallel": 2}):
        with pytest.raises(ValidationError, match="train.sequence_parallel"):
            RunConfig.model_validate({"train": train})
    assert RunConfig.model_validate({"train": {"sequence_parallel": 2}}).train.sequence_parallel == 2
    with pytest.raises(BackendError, match="train.sequence_parallel = 4 must divide the model's 2 attention heads"):
        check_model(make_trainer(base, False).policy.model, 4)


def test_outside_a_split_pass_the_installed_attention_is_plain_sdpa(base):
    """Rank 0 samples and evaluates with the model the trainer installed the split on: outside a split
    pass it must score a left-padded batch exactly as before."""
    import torch

    from rlvr.backends.model.io import forward_inputs
    from rlvr.backends.train.sequence_parallel import ATTENTION, install

    model = make_trainer(base, False).policy.model
    ids = torch.tensor([[0, 0, 31, 32, 33, 34], [41, 42, 43, 44, 45, 46]])
    attn = (torch.arange(6) >= torch.tensor([[2], [0]])).long()
    with torch.no_grad():
        before = model(**forward_inputs(ids, attn)).logits
        install(model)
        after = model(**forward_inputs(ids, attn)).logits
    assert model.config._attn_implementation == ATTENTION
    assert torch.equal(before, after)
