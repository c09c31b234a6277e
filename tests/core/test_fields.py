"""Rows in the field's usual shapes (GSM8K, TRL, verl) mapped by task.fields, and answer extraction."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvr.data.fields import FieldMap, last_boxed, make_extractor
from rlvr.data.readers import read_tasks
from rlvr.data.tasks import carve
from rlvr.errors import DataError

GSM8K = [{"question": f"Tom has {i} apples and buys 2. How many?", "answer": f"{i} + 2 = {i + 2}\n#### {i + 2}"}
         for i in range(5)]
TRL = [{"prompt": [{"role": "user", "content": f"{i}+{i}?"}], "solution": str(2 * i)} for i in range(5)]
VERL = [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"q{i}"}], "ability": "math",
         "reward_model": {"style": "rule", "ground_truth": str(i)}, "extra_info": {"split": "train", "index": i}}
        for i in range(5)]


def jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def parquet(path: Path, rows: list[dict]) -> str:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def gsm8k_map() -> FieldMap:
    return FieldMap.build({"prompt": "question"}, "####")


@pytest.mark.parametrize("write", [jsonl, parquet])
def test_gsm8k_rows_load_with_one_fields_line(tmp_path, write):
    tasks = read_tasks(write(tmp_path / f"gsm8k.{write.__name__}", GSM8K), fields=gsm8k_map())
    assert [t.answer for t in tasks] == ["2", "3", "4", "5", "6"]
    assert tasks[0].messages == ({"role": "user", "content": "Tom has 0 apples and buys 2. How many?"},)
    assert tasks[0].info == {"answer": "0 + 2 = 2\n#### 2"}  # the raw column stays visible to rewards
    assert not tasks[0].conversational


@pytest.mark.parametrize("write", [jsonl, parquet])
def test_trl_conversational_rows_load_with_one_fields_line(tmp_path, write):
    tasks = read_tasks(write(tmp_path / f"trl.{write.__name__}", TRL), fields=FieldMap({"answer": "solution"}))
    assert tasks[3].messages == ({"role": "user", "content": "3+3?"},) and tasks[3].answer == "6"
    assert tasks[3].info == {"solution": "6"} and tasks[3].conversational


def test_a_list_valued_prompt_is_read_as_messages_without_fields(tmp_path):
    rows = [{"prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}], "answer": "x"}]
    (task,) = read_tasks(rows)
    assert [m["role"] for m in task.messages] == ["system", "user"] and task.conversational


@pytest.mark.parametrize("write", [jsonl, parquet])
def test_verl_layout_loads_with_one_mapping(tmp_path, write):
    tasks = read_tasks(write(tmp_path / f"verl.{write.__name__}", VERL),
                       fields=FieldMap({"answer": "reward_model.ground_truth"}))
    assert tasks[2].answer == "2" and tasks[2].messages == ({"role": "user", "content": "q2"},)
    assert tasks[2].info["data_source"] == "openai/gsm8k" and tasks[2].info["extra_info"]["index"] == 2
    assert tasks[2].info["reward_model"]["ground_truth"] == "2" and "prompt" not in tasks[2].info


def test_errors_name_the_row_the_field_and_the_columns(tmp_path):
    path = jsonl(tmp_path / "trl.jsonl", TRL)
    with pytest.raises(DataError, match=r"line 1: fields.answer = 'sol' names no column; columns: \['prompt', "
                                        r"'solution'\]"):
        read_tasks(path, fields=FieldMap({"answer": "sol"}))
    with pytest.raises(DataError, match=r"line 1: field 'answer' is missing; columns: .*fields = \{answer"):
        read_tasks(path)
    with pytest.raises(DataError, match=r"bench row 3: fields.prompt = 'question' names no column"):
        read_tasks([*GSM8K[:3], {"q": "x", "answer": "#### 1"}], fields=gsm8k_map())
    with pytest.raises(DataError, match=r"row 1: answer_extract='####' found no answer in 'no hashes'"):
        read_tasks([GSM8K[0], {"question": "x", "answer": "no hashes"}], fields=gsm8k_map())
    with pytest.raises(DataError, match=r"name no target"):
        FieldMap({"question": "prompt"})
    with pytest.raises(DataError, match=r"either prompt or messages"):
        FieldMap({"prompt": "a", "messages": "b"})


def test_extractors():
    assert make_extractor("####")("so 1,234 apples\n#### 1,234 ") == "1234"
    assert make_extractor("boxed")(r"thus \boxed{\frac{1}{2}} or \boxed{x^{2}}") == "x^{2}"
    assert last_boxed(r"\boxed{unclosed") is None
    assert make_extractor(r"re:answer is (\d+)")("the answer is 42.") == "42"
    assert make_extractor(r"re:\d+")("a 7 b 9") == "7"
    assert make_extractor("mypkg.mod:fn", load=lambda spec: str.upper)("abc") == "ABC"
    with pytest.raises(DataError, match="not a valid regular expression"):
        make_extractor("re:(")
    with pytest.raises(DataError, match="use '####', 'boxed'"):
        make_extractor("hashes")


def test_content_hashes_and_the_split_follow_the_mapped_rows(tmp_path):
    mapped = read_tasks(jsonl(tmp_path / "g.jsonl", GSM8K * 4 + [
        {"question": f"extra {i}", "answer": f"#### {i}"} for i in range(20)]), fields=gsm8k_map())
    native = read_tasks([{"prompt": t.messages[0]["content"], "answer": t.answer} for t in mapped])
    assert [t.content_hash for t in mapped] == [t.content_hash for t in native]
    assert carve(mapped, 0.2, "s").manifest == carve(native, 0.2, "s").manifest


def test_a_saved_dataset_folder_loads_with_the_readme_spelling(tmp_path):
    datasets = pytest.importorskip("datasets")
    folder = tmp_path / "gsm8k"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(GSM8K)}).save_to_disk(str(folder))
    tasks = read_tasks(f"train@{folder}", fields=gsm8k_map())
    assert [t.answer for t in tasks] == ["2", "3", "4", "5", "6"]


def test_without_fields_every_other_column_reaches_info_by_name(tmp_path):
    rows = [{"prompt": [{"role": "user", "content": f"{i}+{i}?"}], "solution": str(2 * i), "level": i,
             "info": {"source": "x"}} for i in range(3)]
    tasks = read_tasks(jsonl(tmp_path / "trl.jsonl", rows), require_answer=False)
    assert [t.info for t in tasks] == [{"source": "x", "solution": str(2 * i), "level": i} for i in range(3)]
    assert all(t.answer is None for t in tasks)
    plain = read_tasks([{"prompt": "1+1=", "answer": "2", "id": "a"}])[0]
    assert plain.info == {} and plain.id == "a"  # rlvr's own row: nothing to fold
    with pytest.raises(DataError, match=r"column 'level' and info\['level'\] differ"):
        read_tasks([{"prompt": "q", "answer": "1", "level": 2, "info": {"level": 3}}])


def test_folding_columns_leaves_the_split_where_it_was():
    bare = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(200)]
    wide = [{**row, "source": "gsm8k", "level": i % 5} for i, row in enumerate(bare)]
    assert [t.id for t in carve(read_tasks(bare), 0.2, "s").heldout] == [
        t.id for t in carve(read_tasks(wide), 0.2, "s").heldout]
