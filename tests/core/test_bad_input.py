"""Inputs no run may take: non-finite answers, NUL characters, rows too large to hold, configs nested too deep."""

from __future__ import annotations

import json
import math
import tracemalloc

import pytest

from rlvr import DataError
from rlvr.data.readers import load_rows, read_tasks
from rlvr.data.tasks import load_tasks

GOOD = {"prompt": "1+1=", "answer": "2"}


@pytest.mark.parametrize("line", [
    '{"prompt": "1+2=", "answer": NaN}',
    '{"prompt": "1+2=", "answer": Infinity}',
    '{"prompt": "1+2=", "answer": -Infinity}',
    '{"prompt": "1+2=", "answer": [3, NaN]}',
    '{"prompt": "1+2=", "answer": {"value": Infinity}}',
])
def test_a_non_finite_answer_is_refused_naming_the_line(tmp_path, line):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + line + "\n")
    with pytest.raises(DataError, match=r"rows.jsonl line 2: field 'answer.*not a finite number"):
        read_tasks(str(path))


def test_a_non_finite_answer_is_refused_in_parquet_and_from_python(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    pq.write_table(pa.table({"prompt": ["a", "b"], "answer": [1.0, math.nan]}), tmp_path / "rows.parquet")
    with pytest.raises(DataError, match=r"rows.parquet row 1: field 'answer' is nan"):
        read_tasks(str(tmp_path / "rows.parquet"))
    with pytest.raises(DataError, match=r"bench row 0: field 'answer' is inf"):
        load_tasks([{"prompt": "x", "answer": math.inf}])
    assert load_tasks([{"prompt": "x", "answer": "NaN"}])[0].answer == "NaN"  # text is text


@pytest.mark.parametrize("row, field", [
    ({"prompt": "1+\u00002=", "answer": "3"}, "prompt"),
    ({"prompt": "1+2=", "answer": "3\u0000"}, "answer"),
    ({"messages": [{"role": "user", "content": "hi\u0000"}], "answer": "3"}, r"messages\[0\].content"),
    ({"prompt": "1+2=", "answer": "3", "info": {"note": "a\u0000b"}}, r"info.note"),
])
def test_a_nul_character_is_refused_naming_the_field(tmp_path, row, field):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(DataError, match=rf"rows.jsonl line 2: field '{field}' holds a NUL character"):
        read_tasks(str(path))


def test_a_nul_byte_in_a_csv_cell_is_refused(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_bytes(b"prompt,answer\n1+1=,2\n1+\x002=,3\n")
    with pytest.raises(DataError, match=r"rows.csv line 3: field 'prompt' holds a NUL character \(at character 2\)"):
        read_tasks(str(path))


def test_an_over_long_line_is_refused_before_it_is_held_whole(tmp_path):
    path = tmp_path / "rows.jsonl"
    big = json.dumps({"prompt": "x" * (8 * 2**20), "answer": "1"})
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps(GOOD) + "\n" + big + "\n")
    tracemalloc.start()
    try:
        with pytest.raises(DataError, match=r"rows.jsonl line 3: longer than 1 MiB \(task.max_row_mb\)"):
            read_tasks(str(path), max_row_bytes=2**20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Today's whole-line read holds the 8 MiB line at least twice (bytes, then text).
    assert peak < 3 * 2**20, f"{peak / 2**20:.1f} MiB held while reading a line bounded at 1 MiB"


def test_a_50_mb_line_is_refused_at_the_default_bound_holding_no_more_than_the_bound(tmp_path):
    path = tmp_path / "rows.jsonl"
    with path.open("w") as f:
        f.write(json.dumps(GOOD) + "\n")
        f.write('{"prompt": "' + "x" * (50 * 2**20) + '", "answer": "1"}\n')
    tracemalloc.start()
    try:
        with pytest.raises(DataError, match=r"rows.jsonl line 2: longer than 8 MiB \(task.max_row_mb\)"):
            read_tasks(str(path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * 8 * 2**20, f"{peak / 2**20:.1f} MiB held while refusing a 50 MB line"


def test_the_bound_counts_lines_like_the_other_errors_and_allows_rows_up_to_it(tmp_path):
    path = tmp_path / "rows.csv"
    row = "prompt,answer\n" + "q,1\n" * 3 + "y" * 900 + ",2\r\n" + "z" * 2000 + ",3\n"
    path.write_text(row)
    with pytest.raises(DataError, match=r"rows.csv line 6: longer than"):
        read_tasks(str(path), max_row_bytes=1000)
    assert len(read_tasks(str(path) + "?limit=4", max_row_bytes=1000)) == 4  # line 5 (900 bytes + CRLF) fits


def test_rows_without_lines_are_measured_once_parsed(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text(json.dumps([GOOD, {"prompt": "q", "answer": "1", "info": {"tests": ["x" * 5000] * 3}}]))
    with pytest.raises(DataError, match=r"rows.json row 1: the row is over"):
        load_rows(str(path), max_row_bytes=10_000)
    assert len(load_rows(str(path), max_row_bytes=None)) == 2
    with pytest.raises(DataError, match=r"bench row 0: the row is over"):
        load_rows([{"prompt": "q" * 20_000, "answer": "1"}], max_row_bytes=10_000)


def test_a_row_nested_too_deep_is_refused_by_its_depth():
    info: dict = {}
    node = info
    for _ in range(500):
        node["a"] = {}
        node = node["a"]
    with pytest.raises(DataError, match=r"bench row 0: field .* is nested more than 64 levels deep"):
        load_tasks([{"prompt": "q", "answer": "1", "info": info}])


def test_max_row_mb_is_a_task_key(tmp_path):
    from rlvr.config.run import load_run_config

    cfg = load_run_config(None, ["--task.max_row_mb=0.5"])
    assert cfg.task.max_row_bytes() == 2**19


def test_a_config_nested_too_deep_is_one_line(tmp_path, capsys):
    from rlvr.cli.commands import main

    path = tmp_path / "deep.toml"
    path.write_text("[task]\nenv_args = {a = " + "[" * 20_000 + "]" * 20_000 + "}\n")
    assert main(["train", str(path), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rlvr: error: ") and "nested too deeply" in err and len(err.splitlines()) == 1
    assert main(["train", "--task.env_args=" + "[" * 20_000 + "]" * 20_000, "--out", str(tmp_path / "run")]) == 2
    assert "nested too deeply" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
