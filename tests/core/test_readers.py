"""Rows from files, Hugging Face datasets and iterables: round trips, limits, and errors that
name the file, line and field. Torch-free; pyarrow and datasets tests skip when those are missing."""

from __future__ import annotations

import csv
import itertools
import json
import re
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from rlvr.data.readers import DataSpec, load_rows, parse_spec
from rlvr.data.tasks import load_tasks
from rlvr.errors import DataError
from support.child_env import child_env

# Row 0's prompt spans two lines in CSV; rows mix prompt and messages, and only one has an id, so
# columnar formats must fill nulls that load_rows then drops.
ROWS = [
    {"prompt": "What is\n1+1?", "answer": "2", "info": {"level": 1}},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
     "answer": "4", "info": {"level": 2}},
    {"prompt": "3+3?", "answer": "6", "info": {"level": 1}, "id": "six"},
]


# --- writers ------------------------------------------------------------------------------------


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def write_json(path, rows):
    path.write_text(json.dumps(rows, indent=1), encoding="utf-8")


def write_csv(path, rows):
    columns = ["prompt", "messages", "answer", "info", "id"]
    with path.open("w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow(columns)
        for r in rows:
            out.writerow(["" if c not in r else json.dumps(r[c]) if c in ("messages", "info") else r[c]
                          for c in columns])


def columns(rows):
    """A column per key of any row (a row without the key gets a null there); building from the
    rows themselves would take the schema from the first row alone."""
    keys = dict.fromkeys(k for r in rows for k in r)
    return {k: [r.get(k) for r in rows] for k in keys}


def arrow_table(rows):
    return pytest.importorskip("pyarrow").table(columns(rows))


def write_parquet(path, rows):
    table = arrow_table(rows)
    import pyarrow.parquet as pq

    pq.write_table(table, path)


def write_arrow(path, rows, stream=False):
    table = arrow_table(rows)
    import pyarrow as pa

    with (pa.ipc.new_stream if stream else pa.ipc.new_file)(str(path), table.schema) as out:
        out.write_table(table)


TEXT_WRITERS = {
    "rows.jsonl": write_jsonl,
    "rows.json": write_json,
    "rows-key.json": lambda p, rows: p.write_text(json.dumps({"rows": rows})),
    "data-key.json": lambda p, rows: p.write_text(json.dumps({"data": rows})),
    "lines-in.json": write_jsonl,  # JSON Lines under a .json name
    "rows.csv": write_csv,
}
ARROW_WRITERS = {
    "rows.parquet": write_parquet,
    "rows.arrow": write_arrow,
    "stream.arrow": lambda p, rows: write_arrow(p, rows, stream=True),
}


# --- round trips --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(TEXT_WRITERS) + sorted(ARROW_WRITERS))
def test_every_file_format_round_trips(tmp_path, name):
    path = tmp_path / name
    {**TEXT_WRITERS, **ARROW_WRITERS}[name](path, ROWS)
    assert load_rows(str(path)) == ROWS
    assert load_rows(path) == ROWS  # a Path is taken as a path, never parsed
    assert [t.answer for t in load_tasks(load_rows(str(path)))] == ["2", "4", "6"]


def test_jsonl_skips_blank_lines_and_a_bom(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + b"\n\n".join(json.dumps(r).encode() for r in ROWS) + b"\n  \n")
    assert load_rows(str(path)) == ROWS


def test_null_values_count_as_absent(tmp_path):
    path = tmp_path / "rows.jsonl"
    write_jsonl(path, [{"prompt": "q", "messages": None, "answer": "a", "info": None}])
    assert load_rows(str(path)) == [{"prompt": "q", "answer": "a"}]


def test_iterables_pass_through_as_fresh_dicts():
    rows = [dict(r) for r in ROWS]
    loaded = load_rows(iter(rows))
    assert loaded == ROWS
    loaded[0]["answer"] = "mutated"
    assert rows[0]["answer"] == "2"

    class Bench:
        questions = ROWS

    assert load_rows(Bench()) == ROWS


def test_a_path_with_at_and_question_marks_is_still_a_path(tmp_path):
    folder = tmp_path / "user@host"
    folder.mkdir()
    path = folder / "odd?name.jsonl"
    write_jsonl(path, ROWS)
    assert load_rows(str(path)) == ROWS
    assert parse_spec(str(path)) == DataSpec(str(path))
    assert load_rows(f"{path}?limit=1") == ROWS[:1]


def test_parse_spec():
    assert parse_spec("train@openai/gsm8k?limit=5") == DataSpec("openai/gsm8k", "train", 5)
    assert parse_spec("data/train.jsonl") == DataSpec("data/train.jsonl")
    assert parse_spec("test@/abs/ds") == DataSpec("/abs/ds", "test")


def test_a_parsed_spec_loads_too(tmp_path):
    write_jsonl(tmp_path / "rows.jsonl", ROWS)
    assert load_rows(parse_spec(f"{tmp_path / 'rows.jsonl'}?limit=2")) == ROWS[:2]


# --- Hugging Face datasets ----------------------------------------------------------------------


@pytest.fixture
def hf():
    return pytest.importorskip("datasets")


def test_saved_dataset_round_trips(tmp_path, hf):
    hf.Dataset.from_dict(columns(ROWS)).save_to_disk(str(tmp_path / "ds"))
    assert load_rows(str(tmp_path / "ds")) == ROWS
    assert load_rows(f"{tmp_path / 'ds'}?limit=2") == ROWS[:2]


def test_dataset_dict_needs_its_split(tmp_path, hf):
    folder = str(tmp_path / "dd")
    splits = {"train": hf.Dataset.from_dict(columns(ROWS)), "test": hf.Dataset.from_dict(columns(ROWS[:1]))}
    hf.DatasetDict(splits).save_to_disk(folder)
    assert load_rows(f"train@{folder}") == ROWS
    assert load_rows(f"test@{folder}") == ROWS[:1]
    assert load_rows(f"train@{folder}", limit=1) == ROWS[:1]
    with pytest.raises(DataError, match=r"needs a split; write SPLIT@.* one of \['test', 'train'\]"):
        load_rows(folder)
    with pytest.raises(DataError, match="has no split 'dev'"):
        load_rows(f"dev@{folder}")


def test_bad_rows_in_a_dataset_name_the_row(tmp_path, hf):
    hf.Dataset.from_dict(columns([ROWS[0], {"prompt": "q", "answer": None}])).save_to_disk(str(tmp_path / "ds"))
    with pytest.raises(DataError) as err:
        load_rows(str(tmp_path / "ds"))
    assert str(err.value) == (f"{tmp_path / 'ds'} row 1: field 'answer' is missing; columns: ['prompt']" + FIELDS_HINT)


def test_a_folder_that_is_not_a_dataset_fails_clearly(tmp_path, hf):
    with pytest.raises(DataError, match="not a dataset folder written by save_to_disk"):
        load_rows(str(tmp_path))


def test_hub_names_go_to_load_dataset(monkeypatch, hf):
    calls = []

    def fake_load_dataset(name, config=None, *, split):
        calls.append((name, config, split))
        if name == "missing/repo":
            raise FileNotFoundError("no such dataset")
        return hf.Dataset.from_dict(columns(ROWS))

    monkeypatch.setattr(hf, "load_dataset", fake_load_dataset)
    assert load_rows("train@openai/gsm8k:main?limit=2") == ROWS[:2]
    assert load_rows("test@openai/gsm8k") == ROWS
    assert calls == [("openai/gsm8k", "main", "train"), ("openai/gsm8k", None, "test")]
    with pytest.raises(DataError, match=r"train@missing/repo: could not load .*FileNotFoundError"):
        load_rows("train@missing/repo")


# --- limits -------------------------------------------------------------------------------------


def test_limit_truncates_in_the_spec_and_the_argument(tmp_path):
    path = tmp_path / "rows.jsonl"
    write_jsonl(path, ROWS)
    assert load_rows(f"{path}?limit=2") == ROWS[:2]
    assert load_rows(str(path), limit=1) == ROWS[:1]
    assert load_rows(f"{path}?limit=1", limit=2) == ROWS[:1]  # the smaller wins
    assert load_rows(f"{path}?limit=99") == ROWS
    assert load_rows(itertools.repeat(ROWS[0]), limit=3) == [ROWS[0]] * 3  # stops an endless source


def test_limit_stops_reading_before_a_later_bad_row(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n{not json\n")
    assert load_rows(str(path), limit=1) == ROWS[:1]


@pytest.mark.parametrize("name", sorted(ARROW_WRITERS))
def test_limit_truncates_columnar_files(tmp_path, name):
    ARROW_WRITERS[name](tmp_path / name, ROWS)
    assert load_rows(f"{tmp_path / name}?limit=2") == ROWS[:2]


@pytest.mark.parametrize("limit", [0, -1, 1.5, "3", True, [2]])
def test_a_bad_limit_argument_is_a_data_error(tmp_path, limit):
    write_jsonl(tmp_path / "rows.jsonl", ROWS)
    with pytest.raises(DataError, match="limit must be a positive integer"):
        load_rows(str(tmp_path / "rows.jsonl"), limit=limit)
    with pytest.raises(DataError, match="limit must be a positive integer"):
        load_rows(ROWS, limit=limit)


@pytest.mark.parametrize("query", ["limit=0", "limit=-1", "limit=abc", "limit=1.5", "limit=", "limit=+2"])
def test_a_bad_limit_in_the_spec_is_a_data_error(tmp_path, query):
    write_jsonl(tmp_path / "rows.jsonl", ROWS)
    with pytest.raises(DataError, match="limit must be a positive integer"):
        load_rows(f"{tmp_path / 'rows.jsonl'}?{query}")


@pytest.mark.parametrize("query", ["lmit=2", "limit=1&limit=2", "limit=1&x=2", ""])
def test_unknown_spec_options_are_refused(tmp_path, query):
    write_jsonl(tmp_path / "rows.jsonl", ROWS)
    with pytest.raises(DataError, match=r"the only option after '\?' is limit=N"):
        load_rows(f"{tmp_path / 'rows.jsonl'}?{query}")


# --- bad rows name the file, line and field -----------------------------------------------------

BAD = {  # name: (row, what the message must say, whether CSV can hold it)
    "missing answer": ({"prompt": "q"}, "field 'answer' is missing", True),
    "empty prompt": ({"prompt": "   ", "answer": "1"}, "non-empty string 'prompt'", True),
    "prompt not a string": ({"prompt": 5, "answer": "1"}, "non-empty string 'prompt'", False),
    "info not a mapping": ({"prompt": "q", "answer": "1", "info": [1]}, "field 'info' must be a mapping", True),
    "messages not a list": ({"messages": "hi", "answer": "1"}, "field 'messages' must be a non-empty list", True),
    "empty messages": ({"messages": [], "answer": "1"}, "field 'messages' must be a non-empty list", True),
    "bad role": ({"messages": [{"role": "robot", "content": "x"}], "answer": "1"}, "messages[0] needs a 'role'", True),
    "content not a string": ({"messages": [{"role": "user", "content": 3}], "answer": "1"},
                             "messages[0].content must be a string", True),
    "role not hashable": ({"messages": [{"role": ["user"], "content": "x"}], "answer": "1"},
                          "messages[0] needs a 'role'", True),
    "not a mapping": ([1, 2], "a row must be a mapping, got list", False),
}


def located(path, fmt):
    """Where the bad row (the fourth, after ROWS) is: JSONL has a blank line before it; CSV has a
    header and row 0's two-line prompt."""
    return {"jsonl": f"{path} line 5", "csv": f"{path} line 6", "json": f"{path} row 3"}[fmt]


@pytest.mark.parametrize("case", sorted(BAD))
@pytest.mark.parametrize("fmt", ["jsonl", "csv", "json"])
def test_bad_rows_name_file_line_and_field(tmp_path, fmt, case):
    row, says, csv_ok = BAD[case]
    if fmt == "csv" and not csv_ok:
        pytest.skip("CSV cells are strings")
    path = tmp_path / f"rows.{fmt}"
    if fmt == "jsonl":
        path.write_text(json.dumps(ROWS[0]) + "\n\n" + "".join(json.dumps(r) + "\n" for r in [*ROWS[1:], row]))
    else:
        {"csv": write_csv, "json": write_json}[fmt](path, [*ROWS, row])
    with pytest.raises(DataError) as err:
        load_rows(str(path))
    assert str(err.value).startswith(located(path, fmt) + ": "), str(err.value)
    assert says in str(err.value)


FIELDS_HINT = ' (map another column with task.fields, e.g. fields = {answer = "solution"})'


def test_the_headline_message(tmp_path):
    path = tmp_path / "train.jsonl"
    write_jsonl(path, [ROWS[0]] * 16 + [{"prompt": "q"}])
    with pytest.raises(DataError) as err:
        load_rows(str(path))
    assert str(err.value) == f"{path} line 17: field 'answer' is missing; columns: ['prompt']" + FIELDS_HINT


def test_bad_rows_from_an_iterable_name_the_row():
    with pytest.raises(DataError, match=r"^bench row 1: field 'answer' is missing; columns: \['prompt'\] \(map"):
        load_rows([ROWS[0], {"prompt": "q"}])


@pytest.mark.parametrize("text, where", [
    ('{"prompt": "q", "answer": 1}\n{"prompt": "q", "answer": }\n',
     "line 2: not valid JSON (Expecting value at column 27)"),
    ('{"prompt": "q", "answer": 1}\n{"prompt": "q"\n', "line 2: not valid JSON"),
    ("\n\nnot json\n", "line 3: not valid JSON"),
    ('{"prompt": "q", "answer": 1' + "9" * 5000 + "}\n", "line 1: not valid JSON"),
])
def test_malformed_jsonl_lines_are_named(tmp_path, text, where):
    path = tmp_path / "rows.jsonl"
    path.write_text(text)
    with pytest.raises(DataError, match="^" + re.escape(f"{path} {where}")):
        load_rows(str(path))


def test_malformed_json_file_names_line_and_column(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text('[\n  {"prompt": "q", "answer": 1},\n  {"prompt": "q" "answer": 2}\n]\n')
    with pytest.raises(DataError, match=r"rows\.json line 3 column 18: not valid JSON \(Expecting ','"):
        load_rows(str(path))


@pytest.mark.parametrize("text", ['{"rows": 3}', '"just a string"', '{"items": []}'])
def test_a_json_file_must_hold_rows(tmp_path, text):
    path = tmp_path / "rows.json"
    path.write_text(text)
    with pytest.raises(DataError, match="must hold a list of rows, or an object with a 'rows' or 'data' list"):
        load_rows(str(path))


def test_csv_cells_that_are_not_json_are_named(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text('prompt,answer,info\nq,1,{}\nq,2,{"level": }\n')
    with pytest.raises(DataError, match=r"rows\.csv line 3: field 'info' is not valid JSON"):
        load_rows(str(path))


def test_csv_rows_with_too_many_cells_or_a_repeated_header_fail(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text("prompt,answer\nq,1\nq,2,extra\n")
    with pytest.raises(DataError, match=r"rows\.csv line 3: 3 cells, but the header names 2 columns"):
        load_rows(str(path))
    path.write_text("prompt,answer,answer\nq,1,2\n")
    with pytest.raises(DataError, match=r"rows\.csv line 1: the header names the column 'answer' twice"):
        load_rows(str(path))


def test_csv_with_fewer_cells_reads_them_as_missing(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text("prompt,answer\nq,1\nq\n")
    with pytest.raises(DataError, match=r"rows\.csv line 3: field 'answer' is missing"):
        load_rows(str(path))


def test_bytes_that_are_not_utf8_are_pinned_to_their_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(json.dumps(ROWS[0]).encode() + b"\n" + b'{"prompt": "\xff"}\n')
    with pytest.raises(DataError, match=r"rows\.jsonl line 2: not UTF-8 text"):
        load_rows(str(path))


@pytest.mark.parametrize("name, text, says", [
    ("empty.jsonl", "", "the file is empty"),
    ("empty.csv", "", "the file is empty"),
    ("empty.json", "", "the file is empty"),
    ("blank.jsonl", "\n  \n", "no rows to load"),
    ("header.csv", "prompt,answer\n", "no rows to load"),
    ("list.json", "[]", "no rows to load"),
])
def test_empty_files_fail_clearly(tmp_path, name, text, says):
    (tmp_path / name).write_text(text)
    with pytest.raises(DataError, match=says):
        load_rows(str(tmp_path / name))


def test_empty_columnar_file_fails_clearly(tmp_path):
    pytest.importorskip("pyarrow")
    (tmp_path / "empty.parquet").write_bytes(b"")
    (tmp_path / "junk.arrow").write_bytes(b"not arrow at all")
    with pytest.raises(DataError, match="the file is empty"):
        load_rows(str(tmp_path / "empty.parquet"))
    with pytest.raises(DataError, match="not a readable Arrow IPC file or stream"):
        load_rows(str(tmp_path / "junk.arrow"))


@pytest.mark.parametrize("spec, says", [
    ([], "no rows to load"),
    (42, "needs a path, a 'split@name' spec or an iterable of rows, got int"),
    ({"prompt": "q", "answer": 1}, "got dict"),
    (b"rows.jsonl", "got bytes"),
    ("", "names no file, folder or dataset"),
    ("@x", "write split@name"),
])
def test_bad_specs_are_data_errors(spec, says):
    with pytest.raises(DataError, match=says):
        load_rows(spec)


def test_missing_and_unknown_files_are_named(tmp_path):
    with pytest.raises(DataError, match=r"nope\.jsonl: no such file or folder$"):
        load_rows(str(tmp_path / "nope.jsonl"))
    with pytest.raises(DataError, match=r"no such file or folder \(for a Hugging Face hub dataset write 'train@"):
        load_rows(str(tmp_path / "org" / "name"))
    (tmp_path / "rows.txt").write_text("x")
    with pytest.raises(DataError, match=r"rows\.txt: cannot read '\.txt' files"):
        load_rows(str(tmp_path / "rows.txt"))
    write_jsonl(tmp_path / "rows.jsonl", ROWS)
    with pytest.raises(DataError, match="a split applies to a Hugging Face dataset, not to a file"):
        load_rows(f"train@{tmp_path / 'rows.jsonl'}")


# --- fuzz: every input loads into valid tasks or fails with DataError -------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
messages = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool", "robot"]) | json_values},
                          optional={"content": st.text(max_size=5) | json_values}) | json_values,
    max_size=3,
)
good_rows = st.fixed_dictionaries(
    {"answer": st.text(max_size=3) | st.integers()},
    optional={"info": st.dictionaries(st.text(max_size=3), json_values, max_size=2), "id": st.text(max_size=3)},
).flatmap(lambda row: st.one_of(
    st.text(min_size=1, max_size=6).filter(str.strip).map(lambda p: {**row, "prompt": p}),
    st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system"]), "content": st.text(max_size=4)}),
             min_size=1, max_size=2).map(lambda m: {**row, "messages": m}),
))
rows = st.one_of(
    good_rows,
    good_rows,
    json_values,
    st.fixed_dictionaries({}, optional={
        "prompt": st.text(max_size=6) | json_values,
        "messages": messages | json_values,
        "answer": st.text(max_size=3) | json_values,
        "info": st.dictionaries(st.text(max_size=3), json_values, max_size=2) | json_values,
        "id": st.text(max_size=3) | json_values,
    }),
)
lines = st.lists(rows.map(json.dumps) | st.text(st.characters(blacklist_categories=("Cs",)), max_size=8),
                 min_size=1, max_size=4)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(via=st.sampled_from(["jsonl", "iterable"]), rows_=st.lists(rows, max_size=4), raw=lines)
def test_fuzz_rows_load_or_raise_data_error(tmp_path_factory, via, rows_, raw):
    source = rows_
    if via == "jsonl":  # odd-length draws write the raw lines, which may not be JSON at all
        source = tmp_path_factory.getbasetemp() / "fuzz.jsonl"
        source.write_text("\n".join(raw if len(rows_) % 2 else map(json.dumps, rows_)) + "\n", encoding="utf-8")
    try:
        loaded = load_rows(source)
    except DataError:
        event("DataError")
        return
    event("loaded")
    assert loaded and all(isinstance(r, dict) for r in loaded)
    assert len(load_tasks(loaded)) == len(loaded)


# --- optional packages and import hygiene -------------------------------------------------------

BLOCK_DATA = (
    "import sys\n"
    "class Block:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.split('.')[0] in {'pyarrow', 'datasets'}:\n"
    "            raise ImportError('blocked: ' + name)\n"
    "sys.meta_path.insert(0, Block())\n"
)


def run_python(code: str) -> subprocess.CompletedProcess:
    env = child_env()
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=60, check=False)


def test_missing_data_extra_is_named(tmp_path):
    (tmp_path / "rows.parquet").write_bytes(b"PAR1")
    (tmp_path / "rows.arrow").write_bytes(b"ARROW1")
    (tmp_path / "ds").mkdir()
    specs = [str(tmp_path / "rows.parquet"), str(tmp_path / "rows.arrow"), str(tmp_path / "ds"), "train@org/name"]
    proc = run_python(
        BLOCK_DATA
        + "from rlvr.data.readers import load_rows\nfrom rlvr.errors import MissingExtraError\n"
        + f"for spec in {specs!r}:\n"
        + "    try:\n        load_rows(spec)\n    except MissingExtraError as e:\n        print('MISSING', e)\n"
    )
    assert proc.stdout.count("MISSING") == 4, proc.stdout + proc.stderr
    assert proc.stdout.count("rlvr[data]") == 4, proc.stdout


def test_import_pulls_in_no_heavy_package():
    proc = run_python(
        "import sys, rlvr.data.readers\n"
        "heavy = {'pyarrow', 'datasets', 'torch', 'numpy', 'pandas'}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
