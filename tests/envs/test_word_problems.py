"""The procedural word problems: rows fixed by the seed, answers that recompute from the worked
solution, GSM8K's ``#### N`` line, a reward that reads the final number, and no near-duplicate twins
for the held-out split to keep together."""

from __future__ import annotations

import random
import re

import pytest

from rlvr.data.tasks import load_tasks
from rlvr.data.twins import find_clusters
from rlvr.envs import PROCEDURAL, procedural_task
from rlvr.envs.tasks import word_problems as wp

STEP = re.compile(r"^([0-9]+(?: [-+*/] [0-9]+)+) = ([0-9]+)$")


def convo(reply: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": "q"}, {"role": "assistant", "content": reply}]


def test_it_is_a_registered_procedural_task():
    assert PROCEDURAL["word_problems"] == ("rlvr.envs.tasks.word_problems", {})
    assert procedural_task("word_problems") == (wp.make_rows, wp.reward_fn)


def test_rows_are_fixed_by_the_seed_prefix_stable_and_leave_the_global_rng_alone():
    assert wp.make_rows(50, seed=3) == wp.make_rows(50, seed=3)
    assert wp.make_rows(50, seed=3) != wp.make_rows(50, seed=4)
    assert wp.make_rows(9, seed=3) == wp.make_rows(50, seed=3)[:9]
    random.seed(123)
    expected = random.random()
    random.seed(123)
    wp.make_rows(20, seed=0)
    assert random.random() == expected


@pytest.mark.parametrize("level", sorted(wp.LEVELS))
def test_every_answer_recomputes_from_its_solution_which_ends_in_the_gsm8k_line(level):
    rows = wp.make_rows(400, seed=1, level=level)
    assert {r["info"]["template"] for r in rows} == set(wp.LEVELS[level])
    for row in rows:
        *steps, last = row["info"]["solution"].split("\n")
        assert last == f"#### {row['answer']}" and re.fullmatch(r"[0-9]+", row["answer"])
        assert len(steps) == row["info"]["steps"] in (2, 3)
        for step in steps:  # each line's arithmetic is right, and the last line's result is the answer
            expr, result = STEP.fullmatch(step).groups()
            assert eval(expr.replace("/", "//")) == int(result), step  # noqa: S307 - digits and operators only
        assert STEP.fullmatch(steps[-1]).group(2) == row["answer"]
        numbers = [int(x) for x in re.findall(r"[0-9]+", row["prompt"])]
        first = [int(x) for x in re.findall(r"[0-9]+", steps[0].split(" = ")[0])]
        assert all(x in numbers for x in first if x != 2), (row["prompt"], steps[0])  # "twice" is the 2


def test_the_share_template_divides_exactly_and_nobody_gives_away_what_they_lack():
    rows = wp.make_rows(300, seed=2, templates=["share", "buy_give", "packs_split", "saves"])
    assert all(int(r["answer"]) >= 0 for r in rows)
    assert all(not re.search(r"/ [0-9]+ = [0-9]+\.", r["info"]["solution"]) for r in rows)


def test_max_number_caps_every_drawn_quantity_and_keeps_rows_fixed_and_right():
    rows = wp.make_rows(300, seed=5, level=1, max_number=6)
    assert rows == wp.make_rows(300, seed=5, level=1, max_number=6) != wp.make_rows(300, seed=5, level=1)
    assert wp.make_rows(8, seed=5, level=1, max_number=6) == rows[:8]
    bills = {"20", "50", "100"}
    for row in rows:
        change = row["info"]["template"] == "change"
        drawn = [x for x in re.findall(r"[0-9]+", row["prompt"]) if not (change and x in bills)]
        # share: Tuesday's count is the total (a multiple of the friends, both capped) less Monday's
        limit = 6 * 6 if row["info"]["template"] == "share" else 6
        assert all(int(x) <= limit for x in drawn), row["prompt"]
        *steps, _ = row["info"]["solution"].split("\n")
        for step in steps:
            expr, result = STEP.fullmatch(step).groups()
            assert eval(expr.replace("/", "//")) == int(result), step  # noqa: S307 - digits and operators only
    assert max(int(x) for r in wp.make_rows(300, seed=5, level=1) for x in re.findall(r"[0-9]+", r["prompt"])) > 6
    with pytest.raises(ValueError, match="word_problems: max_number"):
        wp.make_rows(3, seed=0, max_number=1)
    with pytest.raises(ValueError, match="word_problems: max_number"):
        wp.make_rows(3, seed=0, max_number=True)


def test_no_two_rows_are_twins_under_the_split_rule():
    rows = wp.make_rows(1000, seed=0)
    clusters = find_clusters(load_tasks(rows))
    assert len(set(clusters.root)) == len(rows) and not clusters.links and not clusters.pinned
    # The check can fail: a problem the generator could repeat with its numbers and people, worded
    # a little otherwise, is a twin the rule joins.
    a = "Mia has 7 marbles. She buys 5 more and gives 3 to Leo. How many marbles does Mia have now?"
    b = "Mia has 7 marbles. She gets 5 more and gives 3 to Leo. How many marbles does Mia have now?"
    twins = find_clusters(load_tasks([*rows[:50], {"prompt": a, "answer": "9"}, {"prompt": b, "answer": "9"}]))
    assert twins.cluster_of_row(50) == twins.cluster_of_row(51)


@pytest.mark.parametrize(("reply", "reward", "marked"), [
    ("3 + 4 = 7\n7 + 2 = 9\n#### 9", 1.0, 1.0),
    ("#### 9", 1.0, 1.0),
    ("She has 9 marbles now.", 1.0, 0.0),                # no marker: the last number counts
    ("#### 9\nThat is 3 more than 6.", 1.0, 1.0),         # the marked number wins over a later one
    ("#### 8\nor 9", 0.0, 1.0),
    ("The answer is 9.0", 1.0, 0.0),
    ("I do not know.", 0.0, 0.0),
    ("#### 19", 0.0, 1.0),
])
def test_the_reward_pays_the_final_number(reply, reward, marked):
    score = wp.reward_fn(convo(reply), "9")
    assert score.components["reward"] == reward and score.components["marked"] == marked


def test_bad_options_and_answers_name_the_task():
    with pytest.raises(ValueError, match="word_problems: level"):
        wp.make_rows(3, seed=0, level=7)
    with pytest.raises(ValueError, match="word_problems: templates"):
        wp.make_rows(3, seed=0, templates=["nope"])
    with pytest.raises(ValueError, match="word_problems.reward_fn: answer"):
        wp.reward_fn(convo("9"), "nine")
    with pytest.raises(ValueError, match="no assistant message"):
        wp.reward_fn([{"role": "user", "content": "q"}], "9")
