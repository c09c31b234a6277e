"""``train.micro_batch_tokens``: micro-batches sized by tokens, not rows. No micro-batch a trainer
runs holds more tokens than the cap (packed: the real tokens of its one row; padded: rows x the
longest), the rows stay in order and all are trained, and the gradient of the capped micro-batches
equals the gradient of the whole minibatch read at once, within float32 rounding. A row longer than
the cap is refused naming the row and the key."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

import torch  # noqa: E402

from support.dp_rig import make_batch, make_trainer  # noqa: E402

pytestmark = pytest.mark.train

CAP = 24  # tokens: the batch's 11 rows hold 6 to 13 tokens each, 102 packed (143 padded) in all


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from rlvr.backends.model.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "base", hidden=32, layers=2, heads=2, seed=0)


def tokens(chunk: dict) -> tuple[int, int]:
    """(packed tokens, padded tokens) of a micro-batch the trainer built."""
    attn = chunk.batch["attn"]
    return int(attn.sum()), attn.shape[0] * attn.shape[1]


def gradient(trainer, rollouts) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """The minibatch's gradient as the trainer accumulates it over its micro-batches (no step)."""
    trainer.optimizer.zero_grad(set_to_none=True)
    chunks = trainer._chunks(rollouts)
    for chunk in chunks:
        trainer._loss(chunk.batch, None, chunk.denominators).loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in trainer.policy.model.named_parameters() if p.requires_grad}
    return grads, chunks


@pytest.mark.parametrize("packing", [True, False], ids=["packed", "padded"])
def test_no_micro_batch_exceeds_the_cap_and_the_gradient_is_the_uncut_one(base, packing):
    rollouts = make_batch(shared_prompts=False).rollouts
    lengths = [len(r.prompt_ids) + len(r.completion_ids) for r in rollouts]
    assert max(lengths) <= CAP < sum(lengths)  # every row fits; the minibatch does not

    whole = make_trainer(base, lora=False, micro_batch=256, packing=packing, share_prompts=False)
    want, one = gradient(whole, rollouts)
    assert len(one) == 1  # the reference reads the minibatch in one forward
    capped = make_trainer(base, lora=False, micro_batch=256, packing=packing, share_prompts=False,
                          micro_batch_tokens=CAP)
    got, chunks = gradient(capped, rollouts)

    counted = [tokens(c)[0 if packing else 1] for c in chunks]
    assert all(n <= CAP for n in counted), counted
    assert len(chunks) >= -(-sum(lengths) // CAP) > 1  # cut by tokens, into more than one micro-batch
    assert sum(len(c.batch["prompt_lens"]) for c in chunks) == len(rollouts)  # every row trained once
    # Each gradient element sums the same per-token terms in another grouping (micro-batches, then
    # their sum): equal in exact arithmetic, within float32 rounding of the largest element here.
    scale = max(float(g.abs().max()) for g in want.values())
    assert scale > 0
    for name, g in want.items():
        assert torch.allclose(got[name], g, rtol=1e-4, atol=1e-5 * scale), name


def test_a_step_reports_the_largest_micro_batch_within_the_cap(base):
    trainer = make_trainer(base, lora=True, micro_batch=256, packing=True, share_prompts=False,
                           micro_batch_tokens=CAP)
    metrics = trainer(make_batch(shared_prompts=False))
    assert 0 < metrics["train/micro_batch_tokens"] <= CAP
    assert metrics["train/optimizer_steps"] == 1


def test_the_cut_keeps_rows_in_order_within_rows_and_tokens_and_refuses_a_row_over_the_cap():
    from rlvr.backends.train.micro_batch import cut_micro_batches, forward_tokens
    from rlvr.errors import BackendError

    rollouts = make_batch(n=23, seed=3, shared_prompts=False).rollouts
    for packed in (True, False):
        for rows in (1, 3, 256):
            cuts = cut_micro_batches(rollouts, rows, 30, packed)
            assert [i for c in cuts for i in range(c.start, c.stop)] == list(range(len(rollouts)))
            assert all(c.stop - c.start <= rows and forward_tokens(rollouts[c], packed) <= 30 for c in cuts)
    assert len(cut_micro_batches(rollouts, 4, None, True)) == 6  # no cap: rows alone, as before
    with pytest.raises(BackendError, match=rf"train.micro_batch_tokens = 5, but a rollout of row "
                                           rf"'{rollouts[0].task_id}' alone reads"):
        cut_micro_batches(rollouts, 4, 5, True)


@pytest.mark.slow
def test_two_sharded_ranks_cut_by_tokens_train_what_one_process_trains(base, tmp_path):
    from rlvr.backends.train.distributed import rank_share
    from rlvr.backends.train.micro_batch import cut_micro_batches
    from support.dp_rig import max_diff, one_rank, parity_tolerance, spawn_ranks, weights

    # With 20 tokens, the two ranks' shares of each PPO minibatch (rows of 11, 12, 9 | 13, 8, 9 tokens, then
    # 6, 6, 12 | 10, 6) cut into 3 | 2, then 2 | 1 micro-batches: one rank runs a filler pass each time.
    cap = 20
    shape = {"ppo_n_minibatches": 2, "micro_batch": 256, "packing": True, "micro_batch_tokens": cap}
    batch = make_batch(shared_prompts=False)
    for minibatch in (batch.rollouts[:6], batch.rollouts[6:]):
        counts = [len(cut_micro_batches(minibatch[rank_share(len(minibatch), r, 2)], 256, cap, True))
                  for r in range(2)]
        assert counts[0] != counts[1]
    ranks = spawn_ranks(2, base, True, [("train", batch)] * 2, tmp_path, shard="fsdp", **shape)
    reference, _ = one_rank(base, True, [batch] * 2, share_prompts=False, **shape)
    tolerance = parity_tolerance(base, [batch], 4)
    assert max_diff(weights(reference), weights(make_trainer(base, True))) > 10 * tolerance
    assert max_diff(ranks[0]["weights"], weights(reference)) < tolerance
    assert all(0 < m["train/micro_batch_tokens"] <= cap for m in ranks[0]["metrics"])
