"""``[task] eval_data``: names, and rows shared with the split counted by content, never hidden."""

from __future__ import annotations

import json

import pytest

from rlvr.cli.eval_sets import eval_set_tasks
from rlvr.cli.settings import TaskSection, run_config_from_dict
from rlvr.data.tasks import carve, load_tasks
from rlvr.errors import ConfigError
from rlvr.testing import make_rows


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
