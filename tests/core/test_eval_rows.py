"""What each held-out evaluation scores: a capped, stable sample of held-out (``heldout_max_rows``; the
rest still never trained on), and as many training rows scored the same way, whose score is the
like-for-like side of the pool-vs-held-out gap (the pool score stays the mean reward of samples)."""

from __future__ import annotations

import pytest

from conftest import make_rig, small_config
from rlvr.data.subsample import evaluation_rows, stable_subsample
from rlvr.data.tasks import carve, load_tasks
from rlvr.testing import make_rows
from rlvr.types import EvalReport


def split(n: int = 200):
    return carve(load_tasks(make_rows(n)), 0.25, "salt", 20)


def test_a_subsample_is_stable_capped_and_order_free():
    s = split()
    picked = stable_subsample(s.heldout, 10, "x")
    ids = [t.id for t in picked]
    assert len(picked) == 10 and set(ids) <= {t.id for t in s.heldout}
    assert ids == [t.id for t in s.heldout if t.id in ids]  # the split's order
    assert {t.id for t in stable_subsample(list(reversed(s.heldout)), 10, "x")} == {t.id for t in picked}
    assert {t.id for t in stable_subsample(s.heldout, 10, "y")} != {t.id for t in picked}
    assert stable_subsample(s.heldout, None, "x") == s.heldout == stable_subsample(s.heldout, 10_000, "x")


def test_the_training_sample_is_as_large_as_the_held_out_one_and_never_mixes_sides():
    s = split()
    rows = evaluation_rows(s, 12, train_eval=True)
    assert len(rows.heldout) == len(rows.train) == 12
    assert {t.id for t in rows.heldout} <= {t.id for t in s.heldout}
    assert {t.id for t in rows.train} <= {t.id for t in s.train}
    assert rows.manifest["n_heldout_evaluated"] == rows.manifest["n_train_evaluated"] == 12
    assert rows.manifest["heldout_max_rows"] == 12
    assert evaluation_rows(s, None, train_eval=False).train == ()


class ByTask:
    """A held-out evaluator scoring each task from a table, so a mean can be computed by hand."""

    def __init__(self, table: dict[str, float]):
        self.table, self.seen = table, []

    def __call__(self, step, tasks):
        self.seen.append((step, [t.id for t in tasks]))
        per_task = {t.id: self.table[t.id] for t in tasks}
        return EvalReport(step=step, score=sum(per_task.values()) / len(per_task), n=len(per_task), per_task=per_task)


def test_the_loop_scores_the_capped_held_out_sample_and_the_training_sample_like_for_like(tmp_path):
    rows = make_rows(40)
    cfg = small_config(heldout_max_rows=4, train_eval=True, max_steps=3, heldout_every=3)
    s = carve(load_tasks(rows), cfg.heldout_frac, cfg.split_salt, cfg.corpus_min)
    # Held-out tasks score 0.25, training tasks 1.0: the gap must be 0.75 whatever the pool does.
    table = {**{t.id: 0.25 for t in s.heldout}, **{t.id: 1.0 for t in s.train}}
    rig = make_rig(cfg, rows=rows, out_dir=tmp_path)
    rig.loop.heldout_eval = evaluator = ByTask(table)
    record = rig.loop.run()
    held_ids, train_ids = {t.id for t in s.heldout}, {t.id for t in s.train}
    scored = [ids for _, ids in evaluator.seen]
    assert [step for step, _ in evaluator.seen] == [0, 0, 3, 3]
    assert set(scored[0]) < held_ids and len(scored[0]) == 4  # 10 held out, 4 scored
    assert set(scored[1]) <= train_ids and len(scored[1]) == 4
    assert scored[0] == scored[2] and scored[1] == scored[3]  # the same rows at every evaluation
    manifest = record.run["split"]
    assert manifest["n_heldout"] == 10 and manifest["n_heldout_evaluated"] == 4 and manifest["n_train_evaluated"] == 4
    assert all(e.data["task_ids"] and not set(e.data["task_ids"]) & held_ids for e in record.of_kind("step"))
    summary = record.finished.data["summary"]
    assert summary["pool_heldout_gap"] == {"0": pytest.approx(0.75), "3": pytest.approx(0.75)}
    assert summary["train_eval_scores"] == {"0": 1.0, "3": 1.0}
    assert summary["final_pool_score"] == pytest.approx(record.pool_scores[3])  # still the sampled pool
    event = record.of_kind("heldout")[-1].data
    assert event["train_score"] == 1.0 and event["train_n"] == 4 and event["gap"] == pytest.approx(0.75)
