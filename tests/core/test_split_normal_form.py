"""The split goes by a row's normal form: near-duplicates land on the same side, distinct rows do not merge."""

from __future__ import annotations

import json
import random

import pytest

from conftest import AbortAfter, make_rig, small_config
from rlvr import RLLoopError
from rlvr.data.normal import normal_answer, normal_form, normal_text, split_key
from rlvr.data.tasks import carve, load_tasks, split_tasks


def base_rows(n: int = 80) -> list[dict]:
    return [{"id": f"r{i}", "prompt": f"What is {i} plus {i + 7}?", "answer": str(2 * i + 7)} for i in range(n)]


def trailing_space(row):
    return {**row, "prompt": row["prompt"] + " "}


def other_case(row):
    return {**row, "prompt": row["prompt"].upper()}


def inner_whitespace(row):
    return {**row, "prompt": row["prompt"].replace(" ", "\t  ")}


def answer_as_number(row):
    return {**row, "answer": int(row["answer"])}


def answer_as_float(row):
    return {**row, "answer": float(row["answer"])}


def system_prompt_added(row):
    return {"id": row["id"], "messages": [{"role": "system", "content": "Answer with a number."},
                                          {"role": "user", "content": row["prompt"]}], "answer": row["answer"]}


def token_rows(n: int = 80) -> tuple[list[dict], list[dict]]:
    """Pairs with the same info.prompt_ids and different prompt text."""
    a = [{"id": f"t{i}", "prompt": f"tokens of row {i}", "answer": str(i), "info": {"prompt_ids": [5, i, i + 1]}}
         for i in range(n)]
    b = [{**r, "prompt": f"the same tokens, rendered otherwise ({i})"} for i, r in enumerate(a)]
    return a, b


KINDS = [trailing_space, other_case, inner_whitespace, answer_as_number, answer_as_float, system_prompt_added]


def sides(rows: list[dict], frac: float = 0.25, salt: str = "rlvr-heldout-v1") -> dict[str, bool]:
    train, held = split_tasks(load_tasks(rows), frac, salt)
    return {**{t.id: False for t in train}, **{t.id: True for t in held}}


@pytest.mark.parametrize("variant", KINDS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("salt", ["rlvr-heldout-v1", "another-salt"])
def test_each_kind_of_near_duplicate_lands_on_its_twins_side(variant, salt):
    rows = base_rows()
    twins = [{**variant(r), "id": r["id"] + "-twin"} for r in rows]
    side = sides(rows + twins, salt=salt)
    split_pairs = [r["id"] for r in rows if side[r["id"]] != side[r["id"] + "-twin"]]
    assert not split_pairs, f"{len(split_pairs)} of {len(rows)} pairs fell on opposite sides: {split_pairs[:5]}"
    assert any(side.values()) and not all(side.values())


def test_token_in_rows_go_by_their_tokens_not_their_text():
    a, b = token_rows()
    side = sides(a + [{**r, "id": r["id"] + "-twin"} for r in b])
    assert all(side[r["id"]] == side[r["id"] + "-twin"] for r in a)


def test_distinct_rows_keep_distinct_keys_and_one_prompt_is_one_key_whatever_its_answer():
    rows = base_rows(50)
    keys = {split_key(t) for t in load_tasks(rows)}
    assert len(keys) == 50
    prompts = load_tasks([{"prompt": p, "answer": "5"} for p in ("2+3=", "2+4=", "3+2=", "2-3=", "2+3.5=", "23=")])
    assert len({split_key(t) for t in prompts}) == 6
    # The split keys on the prompt: one question with its answer written six ways is one key.
    one = load_tasks([{"prompt": "2+3=", "answer": a} for a in ("5", "5.5", "-5", [5], "five", "\\boxed{5}")])
    assert len({split_key(t) for t in one}) == 1
    assert len({json.dumps(normal_answer(t.answer)) for t in one}) == 6  # answers keep their own normal form


def test_the_normal_form_is_the_documented_text():
    [task] = load_tasks([{"messages": [{"role": "system", "content": "Be brief."},
                                       {"role": "user", "content": "  What is\tTWO + 3 ?\n"}],
                          "answer": " 1,005.50 "}])
    assert normal_form(task) == '["messages", [["user", "what is 2 + 3"]]]'
    assert normal_text("Ｆｕｌｌ Width") == "fullwidth"  # the answers' text rule: NFKC, case-folded, no whitespace
    assert [normal_answer(a) for a in (25, "25", 25.0, " +25 ", "2.5e1", True, None, {"b": "X ", "a": 1})] == [
        "25", "25", "25", "25", "25", True, None, {"a": "1", "b": "x"}]
    assert normal_answer("1e999999999") == "1E+999999999"  # no billion-digit expansion
    assert normal_answer(0.0) == normal_answer("-0") == "0"


def test_the_split_stays_stable_under_reordering_with_near_duplicates():
    rows = base_rows() + [{**trailing_space(r), "id": r["id"] + "-twin"} for r in base_rows()[::2]]
    shuffled = list(rows)
    random.Random(3).shuffle(shuffled)
    a = carve(load_tasks(rows), 0.25, "s")
    b = carve(load_tasks(shuffled), 0.25, "s")
    assert {t.id for t in a.heldout} == {t.id for t in b.heldout}
    assert a.manifest == b.manifest


def test_a_run_split_before_normal_forms_is_refused_on_resume_saying_why(tmp_path):
    cfg = small_config(max_steps=4, heldout_every=2)
    make_rig(cfg, out_dir=tmp_path, should_abort=AbortAfter(2)).loop.run()
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["split"]["split_by"] == "prompt_twins"
    # As an earlier rlvr recorded it: no split_by, and another held-out set for the same corpus.
    del run["split"]["split_by"]
    run["split"]["heldout_hash"] = "0" * 64
    (tmp_path / "run.json").write_text(json.dumps(run))
    with pytest.raises(RLLoopError, match=r"split by an earlier rlvr, by exact row content; this one splits by each "
                                          r"row's normal form"):
        make_rig(cfg, out_dir=tmp_path).loop.run(resume=True)


def test_a_run_split_by_the_rule_before_resumes_with_the_split_it_recorded(tmp_path):
    """A run whose run.json names the rule ``normal_form`` (prompt and answer, exact) is carved by it
    again on resume: the same held-out rows, though today's rule gives others."""
    cfg = small_config(max_steps=4, heldout_every=2)
    rows = make_rig(cfg).rows
    old = carve(load_tasks(rows), cfg.heldout_frac, cfg.split_salt, cfg.corpus_min, rule="normal_form")
    new = carve(load_tasks(rows), cfg.heldout_frac, cfg.split_salt, cfg.corpus_min)
    assert {t.id for t in old.heldout} != {t.id for t in new.heldout}
    make_rig(cfg, out_dir=tmp_path, rows=old, should_abort=AbortAfter(2)).loop.run()
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["split"]["split_by"] == "normal_form"
    record = make_rig(cfg, out_dir=tmp_path, rows=rows).loop.run(resume=True)  # the rows, carved on resume
    assert record.run["split"]["heldout_hash"] == old.manifest["heldout_hash"]
    assert sorted(record.run["split"]["heldout_ids"]) == sorted(t.id for t in old.heldout)
