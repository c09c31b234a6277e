"""Rows → tasks, the frozen held-out split, and the training cursor."""

from __future__ import annotations

import random

import pytest

from conftest import forbidden, make_rig, small_config
from rlvr import DataError, RLLoop, RLLoopError
from rlvr.data.tasks import TaskCursor, load_tasks, split_manifest, split_tasks
from rlvr.testing import make_rows


def split_of(rows, frac=0.25, salt="rlvr-heldout-v1"):
    return split_tasks(load_tasks(rows), frac, salt)


def test_split_is_stable_when_the_corpus_is_reordered(rows):
    shuffled = list(rows)
    random.Random(7).shuffle(shuffled)
    assert shuffled != rows
    (train_a, held_a), (train_b, held_b) = split_of(rows), split_of(shuffled)
    assert {t.id for t in held_a} == {t.id for t in held_b}
    assert split_manifest(train_a, held_a) == split_manifest(train_b, held_b)
    assert len(held_a) == 10


def test_split_depends_on_the_salt(rows):
    _, held_a = split_of(rows, salt="a")
    _, held_b = split_of(rows, salt="b")
    assert {t.id for t in held_a} != {t.id for t in held_b}


def test_split_sides_are_disjoint_and_cover_the_corpus(rows):
    train, held = split_of(rows)
    assert {t.content_hash for t in train}.isdisjoint(t.content_hash for t in held)
    assert len(train) + len(held) == len(rows)


@pytest.mark.parametrize("frac", [0.1, 0.25, 0.5, 0.9])
def test_duplicates_land_on_the_same_side(rows, frac):
    duplicated = rows + [dict(r) for r in rows[::3]] + [dict(r) for r in rows[::5]]
    tasks = load_tasks(duplicated)
    assert len({t.id for t in tasks}) == len(tasks)  # copies get ~1, ~2 suffixes
    train, held = split_tasks(tasks, frac, "salt")
    held_hashes = {t.content_hash for t in held}
    assert not any(t.content_hash in held_hashes for t in train)
    for t in tasks:
        twins = [u for u in tasks if u.content_hash == t.content_hash]
        assert len({u.content_hash in held_hashes for u in twins}) == 1


def test_loop_never_trains_on_a_held_out_task():
    rig = make_rig(small_config(max_steps=12, tasks_per_step=5))  # 60 draws > 30 train tasks: two epochs
    record = rig.loop.run()
    held_ids = set(record.run["split"]["heldout_ids"])
    held_hashes = {t.content_hash for t in rig.loop.heldout_tasks}
    trained = rig.trained_task_ids()
    assert len(trained) == 60 and len(held_ids) == 10
    assert held_ids.isdisjoint(trained)
    by_id = {t.id: t for t in load_tasks(rig.rows)}
    assert held_hashes.isdisjoint(by_id[i].content_hash for i in trained)
    assert set(trained) == set(by_id) - held_ids  # every training task is drawn


def test_small_corpus_is_refused_before_any_seam_is_called(tmp_path):
    cfg = small_config(corpus_min=20)
    loop = RLLoop.from_reward(cfg, forbidden("reward"), make_rows(19), sampler=forbidden("sampler"),
                              trainer=forbidden("trainer"), heldout_eval=forbidden("heldout_eval"), out_dir=tmp_path)
    with pytest.raises(RLLoopError, match=r"corpus has 19 distinct rows, below corpus_min=20"):
        loop.run()
    assert not (tmp_path / "run.json").exists()


def test_corpus_of_exactly_corpus_min_rows_runs():
    record = make_rig(small_config(corpus_min=20, max_steps=1), rows=make_rows(20)).loop.run()
    assert record.run["split"]["n_train"] + record.run["split"]["n_heldout"] == 20


def test_cursor_walks_a_permutation_per_epoch(rows):
    tasks = load_tasks(rows)[:7]
    cursor = TaskCursor(tasks, seed=3)
    first, second = cursor.take(7), cursor.take(7)
    assert sorted(t.id for t in first) == sorted(t.id for t in tasks)
    assert sorted(t.id for t in second) == sorted(t.id for t in tasks)
    assert [t.id for t in first] != [t.id for t in second]
    assert cursor.state() == {"epoch": 1, "position": 7}


def test_cursor_shuffles_once_per_epoch_and_draws_one_at_a_time_as_in_bulk(rows, monkeypatch):
    import rlvr.data.tasks as tasks_module

    tasks = load_tasks(rows)
    bulk = [t.id for t in TaskCursor(tasks, seed=6).take(3 * len(tasks))]
    shuffles = []
    real = tasks_module.rng_for
    monkeypatch.setattr(tasks_module, "rng_for", lambda *key: shuffles.append(key) or real(*key))
    cursor = TaskCursor(tasks, seed=6)
    one_by_one = [cursor.draw()[0].id for _ in range(3 * len(tasks))]
    assert one_by_one == bulk
    assert shuffles == [(6, "epoch", 0), (6, "epoch", 1), (6, "epoch", 2)]


def test_cursor_restored_from_state_draws_what_the_original_draws(rows):
    tasks = load_tasks(rows)
    a = TaskCursor(tasks, seed=5)
    a.take(13)
    b = TaskCursor(tasks, seed=5)
    b.restore(a.state())
    assert [t.id for t in a.take(50)] == [t.id for t in b.take(50)]


@pytest.mark.parametrize("row, field", [
    ({"answer": "1"}, "prompt"),
    ({"prompt": "   ", "answer": "1"}, "prompt"),
    ({"prompt": "1+0=", "answer": None}, "answer"),
    ({"prompt": "1+0=", "answer": "1", "info": []}, "info"),
    ({"messages": [{"role": "robot", "content": "hi"}], "answer": "1"}, "role"),
    ({"messages": [{"role": "user", "content": 3}], "answer": "1"}, "content"),
    ({"prompt": "1+0=", "answer": {1, 2}}, "JSON-serialisable"),
])
def test_bad_row_is_refused_with_its_index_and_field(row, field):
    with pytest.raises(DataError, match=rf"bench row 1: .*{field}"):
        load_tasks([{"prompt": "ok", "answer": "1"}, row])


def test_bench_object_with_questions_is_accepted():
    class Bench:
        questions = make_rows(3)

    assert len(load_tasks(Bench())) == 3
    with pytest.raises(DataError, match="got str"):
        load_tasks("not rows")


def test_step_events_list_exactly_what_the_trainer_was_given():
    rig = make_rig(small_config(max_steps=4))
    record = rig.loop.run()
    from_events = [i for e in record.events if e.kind == "step" for i in e.data["task_ids"]]
    assert rig.trained_task_ids() == from_events
    assert [c.step for c in rig.trainer.calls] == [1, 2, 3, 4]


def test_task_ids_stay_unique_when_an_explicit_id_looks_like_a_renamed_duplicate():
    rows = [{"id": "a", "prompt": "1+1=", "answer": "2"}, {"id": "a~1", "prompt": "1+2=", "answer": "3"},
            {"id": "a", "prompt": "1+3=", "answer": "4"}]
    ids = [t.id for t in load_tasks(rows)]
    assert len(set(ids)) == 3, ids


def test_duplicates_do_not_count_towards_corpus_min(tmp_path):
    rows = make_rows(19) + make_rows(19)
    loop = RLLoop.from_reward(small_config(corpus_min=20), forbidden("reward"), rows, sampler=forbidden("sampler"),
                              trainer=forbidden("trainer"), heldout_eval=forbidden("heldout_eval"), out_dir=tmp_path)
    with pytest.raises(RLLoopError, match=r"19 distinct rows \(19 are duplicates\)"):
        loop.run()
    assert not (tmp_path / "run.json").exists()


def test_cursor_draws_the_same_tasks_from_a_reordered_corpus(rows):
    tasks = load_tasks(rows)
    a = TaskCursor(tasks, seed=4).take(25)
    b = TaskCursor(list(reversed(tasks)), seed=4).take(25)
    assert [t.id for t in a] == [t.id for t in b]
