"""Sharded checkpoints (``train.checkpoint_layout = "sharded"``, torch.distributed.checkpoint): every
rank writes its own shards, nothing is gathered, and the folder resumes on another number of ranks,
resharded: 2 sharded ranks -> 1 process and -> 3 sharded ranks, 1 process -> 2 sharded ranks, each
matching an uninterrupted one-process run within the float32 tolerance the parity tests derive
(tests/support/dp_rig.py's ``parity_tolerance``). In one process the layout saves and loads exactly,
optimizer state included, and a checkpoint of another LoRA setting is refused naming the folder."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

import torch  # noqa: E402

from support.dp_rig import make_batch, make_trainer, max_diff, one_rank, parity_tolerance, spawn_ranks, weights  # noqa: E402

pytestmark = pytest.mark.train

SHAPE = {"ppo_n_minibatches": 2, "micro_batch": 2}
SHARDED = {**SHAPE, "checkpoint_layout": "sharded"}
CALLS = 3
STEPS = CALLS * SHAPE["ppo_n_minibatches"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from rlvr.backends.model.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "base", hidden=32, layers=2, heads=2, seed=0)


def where_each_piece_is(ckpt) -> dict[str, list[str]]:
    """The file holding each piece of each tensor of a sharded checkpoint (DCP's metadata), by tensor name."""
    import torch.distributed.checkpoint as dcp

    metadata = dcp.FileSystemReader(str(ckpt / "sharded")).read_metadata()
    files: dict[str, list[str]] = {}
    for index, info in metadata.storage_data.items():
        if index.fqn.startswith("model.") or index.fqn.endswith(("exp_avg", "exp_avg_sq")):
            files.setdefault(index.fqn, []).append(info.relative_path)
    return files


@pytest.mark.slow
def test_two_sharded_ranks_write_their_own_shards_and_resume_on_one_and_on_three(base, tmp_path):
    batches = [make_batch(seed=s, step=s + 1) for s in range(CALLS)]
    uninterrupted, _ = one_rank(base, False, batches, **SHAPE)
    tolerance = parity_tolerance(base, batches, STEPS)
    ckpt = tmp_path / "two"
    spawn_ranks(2, base, False, [("train", batches[0]), ("save", str(ckpt))], tmp_path / "a", shard="fsdp", **SHARDED)

    from rlvr.backends.train.checkpoint_io import is_sharded_checkpoint

    assert is_sharded_checkpoint(ckpt) and (ckpt / "trainer.json").is_file()
    assert not (ckpt / "weights.safetensors").exists() and not (ckpt / "optimizer.pt").exists()  # nothing gathered
    assert len(list((ckpt / "sharded").glob("*.distcp"))) == 2  # one file per rank
    for name, files in where_each_piece_is(ckpt).items():  # weights and both AdamW moments
        assert len(files) == 2 and len(set(files)) == 2, (name, files)  # two halves, each in its rank's file

    resumed, _ = one_rank(base, False, batches[1:], load=ckpt, **SHAPE)  # 2 -> 1
    assert resumed.version == 3
    assert max_diff(weights(resumed), weights(uninterrupted)) < tolerance
    three = spawn_ranks(3, base, False, [("load", str(ckpt)), ("train", batches[1]), ("train", batches[2])],
                        tmp_path / "b", shard="fsdp", **SHARDED)  # 2 -> 3: every tensor cut anew
    assert all(r["version"] == 3 for r in three)
    print(f"2 -> 1: {max_diff(weights(resumed), weights(uninterrupted)):.3g}, 2 -> 3: "
          f"{max_diff(three[0]['weights'], weights(uninterrupted)):.3g}, tolerance {tolerance:.3g}")
    assert max_diff(three[0]["weights"], weights(uninterrupted)) < tolerance
    assert max_diff(three[0]["gathered"], weights(uninterrupted)) < tolerance  # rank 0's copy follows the load


@pytest.mark.slow
def test_one_process_sharded_checkpoint_resumes_on_two_sharded_ranks(base, tmp_path):
    batches = [make_batch(seed=s, step=s + 1) for s in range(CALLS)]
    tolerance = parity_tolerance(base, batches, STEPS)
    uninterrupted, _ = one_rank(base, True, batches, save=tmp_path / "one", **SHARDED)  # LoRA, saved after step 1
    assert len(list((tmp_path / "one" / "sharded").glob("*.distcp"))) == 1
    ranks = spawn_ranks(2, base, True, [("load", str(tmp_path / "one")), ("train", batches[1]),
                                        ("train", batches[2])], tmp_path / "b", shard="fsdp", **SHARDED)
    assert ranks[0]["version"] == ranks[1]["version"] == 3
    assert max_diff(ranks[1]["weights"], weights(uninterrupted)) < tolerance


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_one_process_saves_and_loads_the_sharded_layout_exactly(base, lora, tmp_path):
    trained, _ = one_rank(base, lora, [make_batch(seed=1)], **SHARDED)
    trained.save(str(tmp_path / "ckpt"))
    loaded = make_trainer(base, lora, **SHARDED)
    loaded.load(str(tmp_path / "ckpt"))
    assert loaded.version == 1
    assert max_diff(weights(loaded), weights(trained)) == 0.0
    names = [n for n, p in trained.policy.model.named_parameters() if p.requires_grad]
    for old, new in zip(trained.optimizer.param_groups[0]["params"], loaded.optimizer.param_groups[0]["params"],
                        strict=True):
        a, b = trained.optimizer.state[old], loaded.optimizer.state[new]
        assert torch.equal(a["exp_avg"], b["exp_avg"]) and torch.equal(a["exp_avg_sq"], b["exp_avg_sq"])
        assert float(a["step"]) == float(b["step"]) == 2.0
    assert len(names) == len(trained.optimizer.param_groups[0]["params"])
    # The next step from the loaded state is the next step from the trained one.
    batch = make_batch(seed=2, step=2)
    trained(batch)
    loaded(batch)
    assert max_diff(weights(loaded), weights(trained)) == 0.0


def test_a_sharded_checkpoint_of_another_lora_setting_is_refused(base, tmp_path):
    from rlvr.errors import BackendError

    full, _ = one_rank(base, False, [], **SHARDED)
    full.save(str(tmp_path / "full"))
    with pytest.raises(BackendError, match=r"full/sharded: the sharded checkpoint does not hold this policy's"):
        make_trainer(base, True, **SHARDED).load(str(tmp_path / "full"))
