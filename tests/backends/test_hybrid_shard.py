"""Hybrid shard (HSDP) on real processes (gloo on loopback): 4 ranks as 2 replicas x 2 shards train what
one process trains, full fine-tune and LoRA, within the float32 tolerance derived for this batch and
model (tests/support/dp_rig.py's ``parity_tolerance``, as every parity test takes it); each rank holds
half of each parameter (sharded over its group of 2, not over all 4), the two replicas of a shard hold
the same values, rank 0's gathered copy is the trained policy, and the mesh's sharded checkpoint
loads whole in one process. A size that does not divide the
ranks is refused, naming the key."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

import torch  # noqa: E402

from support.dp_rig import make_batch, make_trainer, max_diff, one_rank, parity_tolerance, spawn_ranks, weights  # noqa: E402

SHAPE = {"ppo_n_minibatches": 2, "micro_batch": 2, "max_grad_norm": 0.05}
STEPS = 3


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from rlvr.backends.model.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "base", hidden=32, layers=2, heads=2, seed=0)


def diffs(a, b) -> dict[str, float]:
    return {k: float((a[k] - b[k]).abs().max()) for k in a}


@pytest.mark.slow
@pytest.mark.train
def test_2_replicas_of_2_shards_train_what_one_process_trains_full_and_lora(base, tmp_path):
    batch = make_batch(shared_prompts=False)
    script = [("train", batch)] * STEPS + [("save", str(tmp_path / "ckpt-{lora}"))]
    both = spawn_ranks(4, base, (False, True), script, tmp_path, shard="fsdp", shard_size=2,
                       checkpoint_layout="sharded", **SHAPE)  # one start-up of 4 processes for both modes
    for lora, ranks in both.items():
        # The sharded checkpoint of the 2 x 2 mesh, read whole by one process: exactly the trained weights.
        loaded = make_trainer(base, lora, **SHAPE)
        loaded.load(str(tmp_path / f"ckpt-{lora}"))
        assert loaded.version == STEPS and max_diff(weights(loaded), ranks[0]["weights"]) == 0.0
        reference, metrics = one_rank(base, lora, [batch] * STEPS, share_prompts=False, **SHAPE)
        want = weights(reference)
        # Four shares of each minibatch, reduce-scattered within a group and all-reduced across the two:
        # one process's sums in another order, equal within float32's bound for this batch.
        tolerance = parity_tolerance(base, [batch], STEPS * SHAPE["ppo_n_minibatches"])
        moved = max(diffs(want, weights(one_rank(base, lora, [], **SHAPE)[0])).values())
        got = diffs(ranks[0]["weights"], want)
        print(f"HSDP 2x2, lora {lora}: max weight diff {max(got.values()):.3g}, tolerance {tolerance:.3g}, "
              f"moved {moved:.3g}")
        assert moved > 10 * tolerance  # the steps moved the weights: a real comparison
        assert max(got.values()) < tolerance, sorted(got.items(), key=lambda kv: -kv[1])[:3]
        assert max(diffs(ranks[0]["gathered"], want).values()) < tolerance
        assert all(r["version"] == STEPS for r in ranks)
        # FSDP2 cuts dim 0 into equal pieces, the first ones rounded up: the elements of 1 / parts of it.
        def piece(p: torch.Tensor, parts: int) -> int:
            return -(-p.shape[0] // parts) * (p.numel() // p.shape[0])

        params = dict(reference.policy.model.named_parameters())
        trained = [n for n in ranks[0]["shards"] if n in want]
        # Ranks 0, 1 are one group (the first and second half of every parameter), ranks 2, 3 the other.
        for n in trained:
            assert ranks[0]["shards"][n] == piece(params[n], 2), n  # half, not a quarter: sharded within a group
            assert torch.equal(ranks[0]["local"][n], ranks[2]["local"][n]), n  # the replicas agree
            assert torch.equal(ranks[1]["local"][n], ranks[3]["local"][n]), n
        assert any(piece(params[n], 2) > piece(params[n], 4) for n in trained)  # not sharded over all four
        for g, w in zip(ranks[0]["metrics"], metrics, strict=True):
            assert g["train/grad_norm"] == pytest.approx(w["train/grad_norm"], rel=1e-4, abs=1e-6)
            assert g["loss/total"] == pytest.approx(w["loss/total"], rel=1e-4, abs=1e-6)


def test_shard_size_needs_fsdp_and_is_refused_beside_tensor_parallel():
    from pydantic import ValidationError

    from rlvr.config.run import RunConfig

    servers = {"backend": "http", "url": "http://127.0.0.1:1/v1"}
    cfg = RunConfig.model_validate({"train": {"shard": "fsdp", "shard_size": 2}, "sampler": servers})
    assert cfg.train.shard_size == 2
    with pytest.raises(ValidationError, match=r"train.shard_size = 2 groups FSDP2's shards"):
        RunConfig.model_validate({"train": {"shard_size": 2}})
    with pytest.raises(ValidationError, match=r"train.shard_size = 2 groups FSDP2's shards"):
        RunConfig.model_validate({"train": {"shard": "fsdp", "shard_size": 2, "tensor_parallel": 2},
                                  "sampler": servers})
