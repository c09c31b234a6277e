"""``[task] eval_data``: names, and rows shared with the split (or twins of them) counted, never hidden."""

from __future__ import annotations

import json

import pytest

from rlvr.config.run import TaskSection, run_config_from_dict
from rlvr.data.tasks import carve, load_tasks
from rlvr.errors import ConfigError, DataError
from rlvr.testing import make_rows
from rlvr.wiring.eval_sets import eval_set_tasks


def test_eval_sets_are_named_by_name_or_file():
    section = TaskSection(eval_data=["gsm=a.jsonl?limit=5", "data/test.parquet", "b.jsonl?limit=3"])
    assert section.eval_sets() == {"gsm": "a.jsonl?limit=5", "test": "data/test.parquet", "b": "b.jsonl?limit=3"}


def test_two_eval_sets_of_one_name_are_refused():
    with pytest.raises(ConfigError, match="two eval sets are named 'test'"):
        TaskSection(eval_data=["x/test.jsonl", "y/test.jsonl"]).eval_sets()


def test_rows_shared_with_the_split_are_counted(tmp_path):
    rows = make_rows(40)
    split = carve(load_tasks(rows), 0.25, "s", 20)
    train = {t.content_hash for t in split.train}
    trained = [r for r, t in zip(rows, load_tasks(rows), strict=True) if t.content_hash in train][:3]
    path = tmp_path / "ext.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in trained + make_rows(4, seed=5)))
    cfg = run_config_from_dict({"task": {"name": "addition", "eval_data": [f"ext={path}"]}})
    sets, info = eval_set_tasks(cfg, split)
    assert len(sets["ext"]) == 7
    assert info["ext"] == {"spec": str(path), "n": 7, "in_train": 3, "in_heldout": 0}


def test_twins_of_the_splits_rows_are_counted_as_the_rows(tmp_path):
    rows = make_rows(40)
    split = carve(load_tasks(rows), 0.25, "s", 20)
    train, held = split.train[:3], split.heldout[:2]
    twins = ([{"prompt": t.messages[-1]["content"] + " Answer with a number only.", "answer": f"\\boxed{{{t.answer}}}"}
              for t in train] + [{"prompt": "\u200b" + t.messages[-1]["content"], "answer": t.answer} for t in held])
    path = tmp_path / "ext.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in twins + make_rows(4, seed=5)))
    cfg = run_config_from_dict({"task": {"name": "addition", "eval_data": [f"ext={path}"]}})
    _, info = eval_set_tasks(cfg, split)
    assert info["ext"] == {"spec": str(path), "n": 9, "in_train": 3, "in_heldout": 2}


def test_a_run_of_several_environments_names_its_sets_by_environment(tmp_path):
    path = tmp_path / "ext.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in make_rows(3, seed=5)))
    cfg = run_config_from_dict({"envs": {"add": {"name": "addition", "eval_data": [str(path)]}}})
    sets, info = eval_set_tasks(cfg, carve(load_tasks(make_rows(40)), 0.25, "s", 20))
    assert list(sets) == ["add/ext"] and all(t.env == "add" and t.id.startswith("add/") for t in sets["add/ext"])


def test_an_eval_set_is_read_through_the_sections_fields_as_its_rows_are(tmp_path):
    path = tmp_path / "gsm.jsonl"
    path.write_text("".join(json.dumps({"question": f"What is {i} + 1?", "answer": f"so it is #### {i + 1}"}) + "\n"
                            for i in range(3)))
    cfg = run_config_from_dict({"task": {"name": "addition", "fields": {"prompt": "question"},
                                         "answer_extract": "####", "eval_data": [f"gsm={path}"]}})
    sets, _ = eval_set_tasks(cfg, carve(load_tasks(make_rows(40)), 0.25, "s", 20))
    assert [t.answer for t in sets["gsm"]] == ["1", "2", "3"]
    assert sets["gsm"][0].messages[-1]["content"] == "What is 0 + 1?"


def test_prompt_only_eval_sets_load_for_a_reward_that_takes_no_answer(tmp_path):
    path = tmp_path / "posts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"post {i}"}) + "\n" for i in range(3)))
    cfg = run_config_from_dict({"task": {"name": "addition", "eval_data": [f"posts={path}"]}})
    split = carve(load_tasks(make_rows(40)), 0.25, "s", 20)
    sets, _ = eval_set_tasks(cfg, split, require_answer=False)
    assert [t.answer for t in sets["posts"]] == [None, None, None]
    with pytest.raises(DataError, match="field 'answer' is missing"):
        eval_set_tasks(cfg, split)


@pytest.mark.train
def test_rlvr_eval_scores_the_held_out_rows_the_run_scored():
    pytest.importorskip("torch")
    from rlvr.cli.evaluate import eval_tasks
    from rlvr.data.subsample import evaluation_rows
    from rlvr.wiring.tasks import task_tasks

    cfg = run_config_from_dict({"task": {"name": "addition", "n": 150}, "loop": {"heldout_max_rows": 7}})
    tasks, _ = eval_tasks(cfg, {}, None, None)
    split = carve(task_tasks(cfg)[0], cfg.loop.heldout_frac, cfg.loop.split_salt, cfg.loop.corpus_min)
    assert [t.id for t in tasks] == [t.id for t in evaluation_rows(split, 7, train_eval=False).heldout]
    assert len(tasks) == 7 and len(split.heldout) == 30
