"""Held-out honesty against near-duplicates: for every kind of twin a merged corpus is full of, none
of 300 pairs straddles the split; 300 distinct questions of one template stay distinct and the
held-out share stays near its target; digits are never fuzzed away; a widely quoted exemplar glues
nothing; clusters too large for the held-out side stay in training and are reported."""

from __future__ import annotations

import random

import pytest

from rlvr import RLLoopError
from rlvr.data import minhash
from rlvr.data.normal import normal_form, prompt_tokens
from rlvr.data.split import split_rows, summary_line
from rlvr.data.tasks import carve, load_tasks
from twin_kinds import HARD, KINDS, long_problem, q, row, unique_problem

FRAC = 0.2
SALTS = ["rlvr-heldout-v1", "another-salt"]


def straddling(kind, salt: str, n: int = 300) -> tuple[int, list[bool]]:
    rows = [r for i in range(n) for r in kind(i)]
    held = split_rows(load_tasks(rows), FRAC, salt).heldout
    return sum(held[2 * i] != held[2 * i + 1] for i in range(n)), held


@pytest.mark.parametrize("salt", SALTS)
@pytest.mark.parametrize("name", sorted(KINDS))
def test_no_pair_of_a_kind_straddles_the_split(name, salt):
    split_pairs, held = straddling(KINDS[name], salt)
    assert split_pairs == 0, f"{name}: {split_pairs} of 300 pairs on opposite sides"
    assert sum(held) == 120  # 20% of the 600 rows: whole pairs, as many as the target asks


@pytest.mark.parametrize("name", sorted(HARD))
def test_the_harder_kinds_number_words_instruction_suffix_few_shot_prefix(name):
    # Measured in docs/heldout.md: 0 of 300 for each (number words read as numbers; the question
    # quoted inside the longer prompt joins its cluster).
    for salt in SALTS:
        assert straddling(HARD[name], salt)[0] == 0


@pytest.mark.parametrize("salt", SALTS)
@pytest.mark.parametrize("template", ["short", "long", "own words"])
def test_300_distinct_questions_of_one_template_stay_distinct(template, salt):
    rows = [row({"short": q, "long": long_problem, "own words": unique_problem}[template](i)) for i in range(300)]
    sides = split_rows(load_tasks(rows), FRAC, salt)
    assert sides.summary["clusters"] >= 290
    assert 0.1 <= sum(sides.heldout) / 300 <= 0.3


def test_digits_are_never_fuzzed_away():
    pairs = [("What is 12 plus 13?", "What is 12 plus 14?"), ("What is 12 plus 13?", "What is 12.5 plus 13?"),
             ("What is twelve plus 13?", "What is thirteen plus 13?"),
             ("What is 1,120 plus 13?", "What is 112 plus 13?"),
             (long_problem(7), long_problem(7, edits=1, a=99))]
    for a, b in pairs:
        sides = split_rows(load_tasks([row(a), row(b)] * 2), 0.5, "s")
        assert sides.summary["clusters"] == 2, (a, b)
        assert sides.cluster[0] != sides.cluster[1]


@pytest.mark.parametrize("edits, at_most", [(1, 0), (2, 3)])
def test_lightly_edited_copies_of_word_problems_join_by_minhash(edits, at_most):
    # Measured (docs/heldout.md): 0 of 300 pairs straddle with one word changed, 2 with two, 8 with three.
    kind = lambda i: (row(unique_problem(i)), row(unique_problem(i, edits)))  # noqa: E731
    assert straddling(kind, "s")[0] <= at_most
    # A template's own words changed the same way in every copy: common to the corpus, so left out.
    assert straddling(lambda i: (row(long_problem(i)), row(long_problem(i, 2))), "s")[0] == 0


def test_a_widely_quoted_exemplar_is_kept_in_train_and_glues_nothing():
    exemplars = [q(5000 + j) for j in range(4)]
    shots = "".join(f"Q: {e}\nA: 1\n\n" for e in exemplars)
    rows = ([row(e) for e in exemplars] + [row(f"{shots}Q: {q(i)}\nA:") for i in range(200)]
            + [row(q(i)) for i in range(200)])
    sides = split_rows(load_tasks(rows), FRAC, "s")
    assert not any(sides.heldout[:4])  # every training prompt shows them: kept on the training side
    assert sides.summary["pinned_prompts"] == 4 and sides.summary["clusters"] == 204
    assert all(sides.heldout[4 + i] == sides.heldout[204 + i] for i in range(200))  # each question with its quote
    assert sum(sides.heldout) == 80  # the target, 81 rows, in whole clusters of 2


def test_a_cluster_larger_than_the_heldout_side_stays_in_train_and_is_reported():
    rows = [row(q(i)) for i in range(100)] + [row("Name a prime number.", str(p)) for p in range(60)]
    sides = split_rows(load_tasks(rows), FRAC, "s")
    big = sides.summary["largest"][0]
    assert big["rows"] == 60 and big["side"] == "train" and big["why"] == "same prompt"
    assert sides.summary["large"] == 1 and sides.summary["kept_in_train"] == 1
    assert sum(sides.heldout) == 32 and not any(sides.heldout[100:])
    assert sides.summary["conflicting_answers"] == 1  # one prompt, 60 answers: reported, never split
    assert "largest cluster 60 rows; 1 over 16 rows; 1 larger than the held-out side, kept in train" in summary_line(
        sides.summary)
    with pytest.raises(RLLoopError, match=r"the split left 60 training and 0 held-out.*1 near-duplicate clusters "
                                          r"are larger than the held-out side"):
        carve(load_tasks(rows[100:]), FRAC, "s")


def test_the_split_and_its_clusters_do_not_depend_on_row_order():
    rows = [r for name in ("cyrillic_a", "answer_boxed", "instruction_suffix", "few_shot_prefix")
            for i in range(40) for r in {**KINDS, **HARD}[name](i + 100 * len(name))]
    rows += [r for i in range(40) for r in (row(long_problem(i)), row(long_problem(i, 2)))]
    rows = [{**r, "id": f"r{n}"} for n, r in enumerate(rows)]
    shuffled = list(rows)
    random.Random(5).shuffle(shuffled)
    a, b = carve(load_tasks(rows), FRAC, "s"), carve(load_tasks(shuffled), FRAC, "s")
    assert a.manifest == b.manifest
    sa, sb = split_rows(load_tasks(rows), FRAC, "s"), split_rows(load_tasks(shuffled), FRAC, "s")
    by_id = {r["id"]: c for r, c in zip(rows, sa.cluster, strict=True)}
    assert all(by_id[r["id"]] == c for r, c in zip(shuffled, sb.cluster, strict=True))


def test_numpy_and_pure_python_give_the_same_split(monkeypatch):
    pytest.importorskip("numpy")
    rng = random.Random(0)
    sets = [[rng.getrandbits(32) for _ in range(rng.randint(3, 40))] for _ in range(300)]
    numbers = [rng.getrandbits(64) for _ in sets]
    rows = [r for i in range(150) for r in (row(long_problem(i)), row(long_problem(i, 1)))]
    fast_bands, fast = minhash.band_hashes(sets, numbers), split_rows(load_tasks(rows), FRAC, "s")
    monkeypatch.setattr(minhash, "_NUMPY", [None])
    assert minhash.band_hashes(sets, numbers) == fast_bands
    slow = split_rows(load_tasks(rows), FRAC, "s")
    assert (slow.heldout, slow.cluster, slow.summary) == (fast.heldout, fast.cluster, fast.summary)


def test_each_rule_of_the_normal_form_reads_as_documented():
    examples = {  # rlvr.data.normal's docstring, rule by rule
        "2 &#43; 3": "2 + 3", "Ｆｕｌｌ x²": "full x 2", "tw\u200bo": "2", "١٢": "12", "\u0430": "a",
        "it\u2019s": "it ' s", "\u22123": "- 3", "PARIS": "paris", "**12**": "12", "*12*": "12", "__12__": "12",
        "`12`": "12", "2*3*4": "2 * 3 * 4", "twelve": "12", "twenty-five": "25", "one hundred and five": "105",
        "2+3": "2 + 3", "12 3": "12 3", "123": "123", "1,120": "1120", "12.0": "12", "0.50": "0.5",
        "What is 12 plus 13?": "what is 12 plus 13",
    }
    for text, normal in examples.items():
        assert " ".join(t for t in prompt_tokens(text) if t != "\n") == normal, text
    [task] = load_tasks([{"messages": [{"role": "system", "content": "Be brief."},
                                       {"role": "user", "content": "What is 12 plus 13?"}], "answer": "25"}])
    assert normal_form(task) == '["messages", [["user", "what is 12 plus 13"]]]'


def test_the_manifest_names_the_rule_and_records_the_summary():
    split = carve(load_tasks([r for i in range(50) for r in KINDS["answer_boxed"](i)]), FRAC, "s")
    assert split.manifest["split_by"] == "prompt_twins"
    summary = split.manifest["summary"]
    assert (summary["rows"], summary["prompts"], summary["conflicting_answers"]) == (100, 50, 50)
    assert summary_line(summary).startswith("split (prompt_twins): 100 rows -> 80 train, 20 held out")
