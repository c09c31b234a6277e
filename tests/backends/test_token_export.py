"""The trainer's token export: each sequence it trains, per optimizer step, with the per-token arrays the loss
read (the rl/ce/ref_kl weights of a mixed batch, advantages, sampler/trainer/snapshot log-probs, entropy, ratio,
mismatch KL); a step is complete when every rank's marker is there, and two data-parallel ranks' files
together hold the whole batch, each sequence once per optimizer step, as one process exports it."""

from __future__ import annotations

import dataclasses
import math

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

import torch  # noqa: E402

from rlvr.backends.model.tiny import build_tiny_model  # noqa: E402
from rlvr.backends.train.token_export import TokenExport  # noqa: E402
from rlvr.backends.train.trainer import completion_logprobs, pack  # noqa: E402
from rlvr.record.token_exports import is_complete, latest_complete, marker_file, read_step, summary  # noqa: E402
from rlvr.testing import batch_of  # noqa: E402
from support.dp_rig import make_batch, make_trainer, spawn_ranks  # noqa: E402

pytestmark = pytest.mark.train


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    folder = tmp_path_factory.mktemp("token-export") / "base"
    build_tiny_model(folder, hidden=32, layers=2, heads=2, seed=0)
    return folder


def mixed_batch():
    """Eight rollouts: 0-3 rl only, 4-5 rl and ce (an sft-style component), 6-7 rl and ref_kl (with the
    reference's log-probs), so each record's streams say which component trained which token."""
    rollouts = list(make_batch(8, seed=1).rollouts)
    for i in (4, 5):
        rollouts[i] = dataclasses.replace(rollouts[i], ce_weights=tuple(float(m) for m in rollouts[i].mask))
    for i in (6, 7):
        r = rollouts[i]
        rollouts[i] = dataclasses.replace(r, ref_kl_weights=tuple(0.5 * m for m in r.mask),
                                          ref_logprobs=tuple(-1.0 * m for m in r.mask))
    return batch_of(rollouts, None, step=1)


def test_a_trainer_exports_every_sequence_with_the_streams_the_loss_read(base, tmp_path):
    batch = mixed_batch()
    trainer = make_trainer(base, True, ppo_n_minibatches=2, micro_batch=3, update_epochs=2,
                           token_export=TokenExport(tmp_path / "exp", run="r"))
    policy = trainer.policy
    pad = policy.tokenizer.pad_token_id
    with torch.no_grad():  # the log-probs the first minibatch is trained at, computed apart from the trainer
        before = completion_logprobs(policy.model, pack(batch.rollouts[:4], pad, "cpu"), 1.0)
    trainer(batch)
    records = read_step(tmp_path / "exp", 1)
    assert records is not None and latest_complete(tmp_path / "exp") == 1
    # Two minibatches of 4, trained in two epochs: every sequence once per optimizer step.
    assert [(r["epoch"], r["minibatch"], r["row"]) for r in records] == [
        (e, k, i) for e in (0, 1) for k in (0, 1) for i in range(4)]
    for record in records:
        rollout = batch.rollouts[4 * record["minibatch"] + record["row"]]
        n = len(rollout.completion_ids)
        assert record["completion_ids"] == list(rollout.completion_ids) and record["run"] == "r"
        assert record["rl"] == pytest.approx(list(rollout.rl_mask))
        assert record["advantages"] == pytest.approx(list(rollout.advantages), abs=1e-6)
        assert (record["ce"] or [0.0] * n) == pytest.approx(list(rollout.ce_weights or [0.0] * n))
        assert (record["ref_kl"] or [0.0] * n) == pytest.approx(list(rollout.ref_kl_weights or [0.0] * n))
        assert record["sampler_logprobs"] == pytest.approx(list(rollout.logprobs), abs=1e-6)
        assert all(len(record[k]) == n for k in ("mask", "trainer_logprobs", "entropy", "ratio", "mismatch_kl"))
        for lp, sp, kl in zip(record["trainer_logprobs"], record["sampler_logprobs"], record["mismatch_kl"],
                              strict=True):
            assert kl >= 0 and kl == pytest.approx(math.exp(lp - sp) - (lp - sp) - 1, rel=1e-4, abs=1e-5)
    first = [r for r in records if (r["epoch"], r["minibatch"]) == (0, 0)]
    assert all(r["old_logprobs"] is None and set(r["ratio"]) == {1.0} for r in first)  # on-policy: no snapshot
    for row, record in enumerate(first):  # trained at the weights the call began with
        n = len(record["completion_ids"])
        assert record["trainer_logprobs"] == pytest.approx(before[row, :n].tolist(), abs=1e-5)
    later = [r for r in records if (r["epoch"], r["minibatch"]) == (0, 1)]
    assert all(r["old_logprobs"] is not None for r in later)
    # A batch mixing components: the ce and ref_kl streams are on exactly the rows that carry them.
    assert {r["row"] + 4 * r["minibatch"] for r in records if r["ce"] and any(r["ce"])} == {4, 5}
    assert {r["row"] + 4 * r["minibatch"] for r in records if r["ref_kl"] and any(r["ref_kl"])} == {6, 7}
    stats = summary(records)
    assert stats["token_export/records"] == 16 and stats["token_export/mismatch_kl_max"] >= 0
    assert stats["token_export/trained_tokens"] == 2 * sum(sum(1 for m in r.mask if m) for r in batch.rollouts)


def test_a_step_is_complete_only_once_its_marker_is_written_and_retraining_starts_it_over(base, tmp_path):
    root = tmp_path / "exp"
    export = TokenExport(root, run="r", rank=0, world_size=2)
    trainer = make_trainer(base, True, token_export=export)
    trainer(make_batch(4, step=1))
    assert marker_file(root, 1, 0).exists() and not is_complete(root, 1)  # rank 1 of 2 has not finished
    assert read_step(root, 1) is None
    marker_file(root, 1, 1).write_text('{"records": 0, "world_size": 2}')
    (root / "step_000001" / "rank_1.jsonl").write_text("")
    assert len(read_step(root, 1)) == 4
    export.begin(1)  # the step trained again (a resumed run): not complete until it finishes again
    assert not is_complete(root, 1) and (root / "step_000001" / "rank_0.jsonl").read_text() == ""
    export.close()


@pytest.mark.slow
def test_two_ranks_multiplex_one_step_into_their_files_as_one_process_exports_it(base, tmp_path):
    batch = make_batch(11, seed=2)
    shape = {"ppo_n_minibatches": 2, "micro_batch": 2}
    spawn_ranks(2, base, True, [("train", batch)], tmp_path / "ranks", token_export=str(tmp_path / "two"), **shape)
    make_trainer(base, True, token_export=TokenExport(tmp_path / "one", run="r"), **shape)(batch)
    two, one = read_step(tmp_path / "two", 1), read_step(tmp_path / "one", 1)
    assert {r["rank"] for r in two} == {0, 1} and len(two) == len(one) == 11
    key = lambda r: (r["minibatch"], tuple(r["prompt_ids"]), tuple(r["completion_ids"]))  # noqa: E731
    assert sorted(map(key, two)) == sorted(map(key, one))
    by_key = {key(r): r for r in one}
    for record in two:  # the same log-probs at the same weights, whichever rank read the sequence
        assert record["trainer_logprobs"] == pytest.approx(by_key[key(record)]["trainer_logprobs"], abs=1e-5)


def test_a_run_with_train_token_export_leaves_each_step_complete_in_its_folder(tmp_path):
    from rlvr.cli.commands import main

    run = tmp_path / "run"
    assert main(["train", "--out", str(run), "--model.hidden=32", "--model.layers=2", "--model.heads=2",
                 "--model.threads=1", "--task.n=120", "--loop.max_steps=2", "--loop.heldout_every=2",
                 "--loop.tasks_per_step=2", "--loop.group_k=2", "--loop.lora_rank=2", "--sampler.max_new_tokens=4",
                 "--log.progress=off", "--watchdog.enabled=false", "--train.token_export=true"]) == 0
    root = run / "token_exports"
    assert latest_complete(root) == 2
    for step in (1, 2):
        records = read_step(root, step)
        assert len(records) == 4 and {r["step"] for r in records} == {step} and {r["run"] for r in records} == {"run"}
        assert all(r["reward"] is not None and r["sample_version"] == step - 1 for r in records)
