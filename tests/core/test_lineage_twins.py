"""What a lineage file keeps of the rows a model was trained on is enough to find their near-duplicates
among another run's rows, without the rows: re-scraped copies, a question quoted inside a few-shot
prompt, a question with an instruction after it; distinct questions are not matched. Files of format 1
(keys of prompt and answer) are still read."""

from __future__ import annotations

import json

from rlvr.data.fingerprints import Part, near_matches
from rlvr.data.normal_v1 import short_row_keys
from rlvr.data.tasks import load_tasks
from rlvr.record.lineage import LINEAGE_FILE, find_lineage, write_lineage
from twin_kinds import q, row, unique_problem


def test_near_duplicates_of_trained_rows_are_found_by_their_hashes():
    trained = load_tasks([row(unique_problem(i)) for i in range(200)] + [row(q(i)) for i in range(200)]
                         + [row(f"Q: {q(1000 + i)}\nA: 7\n\nQ: {q(2000 + i)}\nA:") for i in range(100)])
    part = Part.from_json(json.loads(json.dumps(Part.of(trained).to_json())))  # as a lineage file keeps it
    twins = load_tasks([row(unique_problem(i, edits=1)) for i in range(100)]  # re-scraped: near
                       + [row(q(i) + " Answer with a number only.") for i in range(100)]  # quoting a trained row
                       + [row(q(1000 + i)) for i in range(100)])  # quoted inside a trained row
    assert sum(near_matches(twins, [part])) == 300
    others = load_tasks([row(unique_problem(i + 3000)) for i in range(100)] + [row(q(i + 5000)) for i in range(200)]
                        + [row(f"What is {i} times {i + 1}?") for i in range(100)])
    assert sum(near_matches(others, [part])) == 0  # other numbers, other questions


def test_a_lineage_file_names_near_duplicates_and_reads_format_one(tmp_path):
    trained = load_tasks([row(unique_problem(i)) for i in range(50)])
    heldout = load_tasks([row(unique_problem(i, edits=2), "#### 1") for i in range(10)]
                         + [row(unique_problem(i + 3000)) for i in range(10)])
    (tmp_path / "new").mkdir()
    write_lineage(tmp_path / "new", {"format": 2, "trained_on": [],
                                     "near": {"trained_on": [Part.of(trained).to_json()]}})
    seen, near = find_lineage(str(tmp_path / "new")).seen(heldout)
    assert [t.id for t in seen] == [t.id for t in heldout[:10]] and near == 10
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / LINEAGE_FILE).write_text(json.dumps({"format": 1, "trained_on": short_row_keys(heldout[:3])}))
    seen, near = find_lineage(str(tmp_path / "old")).seen(heldout)
    assert [t.id for t in seen] == [t.id for t in heldout[:3]] and near == 0
