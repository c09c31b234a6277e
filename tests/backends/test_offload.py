"""CPU offload of the trainer's state (``train.offload``): the updates equal the non-offloaded run's
within the derived float32 tolerance, and the state lives where the setting says.

On this machine the policy's device is the CPU, so "host memory" and "device memory" are the same
RAM: the tests check the arithmetic (the copies out and back, FSDP2's offload path) and that the
state is held by the offloading objects (HostAdamW's master copies and moments, FSDP2's shards with
its CPU offload policy), not that device memory was saved; ``bench/offload.py`` prints the memory."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from support.dp_rig import make_batch, make_trainer, max_diff, one_rank, parity_tolerance, spawn_ranks, weights  # noqa: E402

pytestmark = [pytest.mark.train]

SHAPE = {"ppo_n_minibatches": 2, "micro_batch": 2, "max_grad_norm": 0.05}
CALLS = 3  # 6 optimizer steps


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from rlvr.backends.model.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "base", hidden=32, layers=2, heads=2, seed=0)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_optimizer_offload_trains_what_the_plain_trainer_trains(base, lora, tmp_path):
    import torch

    from rlvr.backends.train.offload import HostAdamW, where_state_lives

    batch = make_batch()
    plain, plain_metrics = one_rank(base, lora, [batch] * CALLS, **SHAPE)
    offloaded, metrics = one_rank(base, lora, [batch] * CALLS, offload="optimizer", **SHAPE)
    tolerance = parity_tolerance(base, [batch], CALLS * SHAPE["ppo_n_minibatches"])

    assert isinstance(offloaded.optimizer, HostAdamW)
    assert max_diff(weights(plain), weights(make_trainer(base, lora))) > 10 * tolerance  # the weights moved
    assert max_diff(weights(offloaded), weights(plain)) < tolerance
    assert [m["train/grad_norm"] for m in metrics] == pytest.approx([m["train/grad_norm"] for m in plain_metrics])
    # The moments belong to the host master copies, not to the weights the model computes with.
    live = {p.data_ptr() for p in offloaded.policy.trainable_parameters()}
    assert not live & {m.data_ptr() for m in offloaded.optimizer.master}
    assert all(len(s) == 3 for s in offloaded.optimizer.state.values())  # step, exp_avg, exp_avg_sq
    assert where_state_lives(offloaded)["optimizer_state"] == ["cpu"]
    assert set(offloaded.optimizer.state) <= set(offloaded.optimizer.master)
    assert not any(isinstance(k, torch.Tensor) and k.data_ptr() in live for k in offloaded.optimizer.state)
    # The checkpoint keeps the common layout: an offloaded run resumes without offload and continues alike.
    offloaded.save(str(tmp_path / "ckpt"))
    resumed = make_trainer(base, lora, **SHAPE)
    resumed.load(str(tmp_path / "ckpt"))
    offloaded(batch)
    resumed(batch)
    assert max_diff(weights(resumed), weights(offloaded)) < tolerance


def test_offload_refusals_name_the_key():
    from pydantic import ValidationError

    from rlvr.backends.train.offload import adamw
    from rlvr.config.run import RunConfig
    from rlvr.errors import BackendError

    cases = [({"train": {"offload": "optimizer"}}, "model.device = 'cpu'"),
             ({"model": {"device": "cuda"}, "train": {"offload": "params"}}, "set train.shard = 'fsdp'"),
             ({"model": {"device": "cuda"}, "train": {"offload": "optimizer", "shard": "fsdp"},
               "sampler": {"backend": "http", "url": "http://127.0.0.1:1/v1"}}, "set train.offload = 'params'")]
    for data, words in cases:
        with pytest.raises(ValidationError, match="train.offload") as info:
            RunConfig.model_validate(data)
        assert words in str(info.value)
    assert RunConfig.model_validate({"model": {"device": "cuda"}, "train": {"offload": "optimizer"}}).train.offload
    with pytest.raises(BackendError, match="train.offload = 'params'"):
        adamw([], lr=1.0, weight_decay=0.0, offload="params", sharded=False)


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_fsdp_cpu_offload_on_two_gloo_ranks_trains_what_one_process_trains(base, lora, tmp_path):
    batch = make_batch(shared_prompts=False)
    ranks = spawn_ranks(2, base, lora, [("train", batch)] * CALLS, tmp_path, shard="fsdp", offload="params", **SHAPE)
    reference, _ = one_rank(base, lora, [batch] * CALLS, share_prompts=False, **SHAPE)
    tolerance = parity_tolerance(base, [batch], CALLS * SHAPE["ppo_n_minibatches"])

    assert max_diff(ranks[0]["weights"], weights(reference)) < tolerance
    assert max_diff(ranks[0]["gathered"], weights(reference)) < tolerance
    for rank in ranks:  # FSDP2's CPU offload holds every shard, and AdamW's state over them, in host memory
        assert rank["offloaded"] and all(rank["offloaded"])
        assert rank["where"]["params"] == rank["where"]["optimizer_state"] == ["cpu"]


@pytest.mark.slow
def test_optimizer_offload_on_two_replicated_gloo_ranks_trains_what_one_process_trains(base, tmp_path):
    batch = make_batch()
    ranks = spawn_ranks(2, base, False, [("train", batch)] * CALLS, tmp_path, offload="optimizer", **SHAPE)
    reference, _ = one_rank(base, False, [batch] * CALLS, **SHAPE)
    tolerance = parity_tolerance(base, [batch], CALLS * SHAPE["ppo_n_minibatches"])

    assert max_diff(ranks[0]["weights"], weights(reference)) < tolerance
    assert max_diff(ranks[1]["weights"], ranks[0]["weights"]) == 0.0  # the replicas stay identical
    assert all(rank["where"]["master"] == ["cpu"] for rank in ranks)
