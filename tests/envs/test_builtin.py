"""Built-in environments: parsing, exact match, math-verify, procedural tasks (verifiers: test_verifiers.py)."""

from __future__ import annotations

import importlib.util
import random
import sys
import threading
import time

import pytest

from rlvr.envs import PROCEDURAL, procedural_task
from rlvr.envs.graders.exact_match import ExactMatch
from rlvr.envs.loading import load_environment
from rlvr.envs.parsing import (
    answer_tag,
    content_text,
    extract,
    last_assistant_text,
    last_boxed,
    last_number,
    normalize,
)
from rlvr.envs.tasks import countdown, reverse_text, sorting
from rlvr.errors import DataError, MissingExtraError, RewardError
from rlvr.reward import Score, evaluate_reward


def convo(text: str, prompt: str = "q") -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": text}]


# ---------------------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{42}.", "42"),
        ("\\boxed{1} then \\boxed{2}", "2"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{\\boxed{3}}", "\\boxed{3}"),  # outermost, not the nested one
        ("\\boxed{7} and a truncated \\boxed{8", "7"),  # the last *complete* one
        ("\\boxed{a \\} b}", "a \\} b"),  # escaped braces do not count
        ("\\fbox{x}", "x"),
        ("\\boxed 5 apples", "5"),
        ("\\boxed{}", ""),
        ("no box here", None),
        ("\\boxedx{1}", None),
        ("\\boxed{", None),
    ],
)
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


def test_answer_tag():
    assert answer_tag("<answer> 4 </answer> then <answer>5</answer>") == "5"
    assert answer_tag("<ANSWER>\nmulti\nline\n</Answer>") == "multi\nline"
    assert answer_tag("<answer>7") is None
    assert answer_tag("<answer>7", allow_unclosed=True) == "7"
    assert answer_tag("<answer>1</answer><answer>2", allow_unclosed=True) == "2"
    assert answer_tag("<final>x</final>", "final") == "x"
    assert answer_tag("nothing") is None and answer_tag(None) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [("the answer is 42.", "42"), ("-3 and then 1,234.5", "1,234.5"), ("x = .5", ".5"), ("1,2,3", "3"),
     ("\u22127", "-7"), ("none", None)],
)
def test_last_number(text, expected):
    assert last_number(text) == expected


@pytest.mark.parametrize(
    ("text", "kwargs", "expected"),
    [(" 1,234 ", {}, "1234"), ("$5$", {}, "5"), ("42.", {}, "42"), ("1,2,3", {}, "1,2,3"),
     ("New  York", {}, "NewYork"), ("New  York", {"remove_spaces": False}, "New York"),
     ("Paris", {"casefold": True}, "paris"), ("\u22123", {}, "-3"), (7, {}, "7"), ("1.5", {}, "1.5")],
)
def test_normalize(text, kwargs, expected):
    assert normalize(text, **kwargs) == expected


def test_extract_tries_methods_in_order_and_rejects_unknown_ones():
    text = "<answer>a</answer> \\boxed{b} 3"
    assert extract(text) == "a"
    assert extract(text, ("boxed", "tags")) == "b"
    assert extract("just 12", ("tags", "boxed", "number")) == "12"
    assert extract("nothing", ("tags",)) is None
    with pytest.raises(ValueError, match="unknown method 'regex'"):
        extract(text, ("regex",))


def test_last_assistant_text_reads_parts_and_requires_an_assistant_message():
    parts = [{"type": "text", "text": "4"}, {"type": "image_url", "image_url": {}}, {"type": "text", "text": "2"}]
    messages = [{"role": "assistant", "content": "old"}, {"role": "user", "content": "again"},
                {"role": "assistant", "content": parts}]
    assert last_assistant_text(messages) == "42"
    assert content_text(None) == ""
    with pytest.raises(ValueError, match="my_reward: messages hold no assistant message"):
        last_assistant_text([{"role": "user", "content": "x"}], who="my_reward")


# ------------------------------------------------------------------------------------ exact match


@pytest.mark.parametrize(
    ("reply", "answer", "correct"),
    [("Paris", "paris", 1.0), ("  Paris. ", "Paris", 1.0), ("1,000", "1000", 1.0), ("$12$", "12", 1.0),
     ("Lyon", "Paris", 0.0), ("Paris, France", "Paris", 0.0), ("", "Paris", 0.0),
     ("NYC", ["New York", "nyc"], 1.0), ("LA", ("New York", "NYC"), 0.0), ("3", [3, "three"], 1.0),
     ("0.5", 0.5, 1.0)],
)
def test_exact_match_without_tags(reply, answer, correct):
    score = ExactMatch().reward_fn(convo(reply), answer)
    assert isinstance(score, Score)
    assert score.value == correct and score.metrics == {"correct": correct, "parsed": 1.0}


@pytest.mark.parametrize(
    ("reply", "correct", "parsed"),
    [("thinking... <answer>Paris</answer>", 1.0, 1.0), ("<answer>Lyon</answer>", 0.0, 1.0),
     ("Paris", 0.0, 0.0), ("<answer>Paris", 0.0, 0.0), ("<answer>x</answer> <answer> PARIS </answer>", 1.0, 1.0)],
)
def test_exact_match_with_tags_reports_parsed(reply, correct, parsed):
    result = evaluate_reward(ExactMatch(tags=True), convo(reply), ["paris", "Paris, France"])
    assert result.value == correct
    assert result.metrics == {"correct": correct, "parsed": parsed}


def test_exact_match_options():
    assert ExactMatch(casefold=False).reward_fn(convo("paris"), "Paris").value == 0.0
    assert ExactMatch(remove_spaces=False).reward_fn(convo("NewYork"), "New York").value == 0.0
    assert ExactMatch(remove_spaces=False).reward_fn(convo("New   York"), "New York").value == 1.0
    assert ExactMatch(tags=True, allow_unclosed=True).reward_fn(convo("<answer>4"), "4").value == 1.0
    assert ExactMatch(tags=True, tag="final").reward_fn(convo("<final>4</final>"), "4").value == 1.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"tags": "yes"}, "tags must be true or false"), ({"casefold": 1}, "casefold"),
     ({"tag": "<answer>"}, "bare tag name"), ({"tag": ""}, "bare tag name")],
)
def test_exact_match_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ExactMatch(**kwargs)


def test_exact_match_bad_gold_answers_are_data_errors():
    with pytest.raises(DataError, match="empty list"):
        ExactMatch().reward_fn(convo("x"), [])
    with pytest.raises(DataError, match="string or a number, got None"):
        ExactMatch().reward_fn(convo("x"), ["a", None])
    with pytest.raises(RewardError, match="DataError"):
        evaluate_reward(ExactMatch(), convo("x"), {"a": 1})


# ------------------------------------------------------------------------------------ math-verify

HAS_MATH_VERIFY = importlib.util.find_spec("math_verify") is not None
needs_math_verify = pytest.mark.skipif(not HAS_MATH_VERIFY, reason="math-verify is not installed "
                                       "(pip install 'rlvr[math]' / pip install math-verify)")


def test_math_verify_missing_names_the_extra(monkeypatch):
    from rlvr.envs.graders.math import MathVerify

    monkeypatch.setitem(sys.modules, "math_verify", None)  # makes `import math_verify` fail
    with pytest.raises(MissingExtraError, match=r"'math_verify'.*rlvr\[math\]"):
        MathVerify()
    with pytest.raises(MissingExtraError, match=r"rlvr\[math\]"):
        load_environment("rlvr.envs.graders.math")


@needs_math_verify
def test_math_verify_too_old_names_the_version(monkeypatch):
    import importlib.metadata

    from rlvr.envs.graders.math import MathVerify

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.7.0" if name == "math-verify" else real(name))
    with pytest.raises(MissingExtraError, match=r"math-verify 0\.7\.0 is too old.*>= 0\.8.*rlvr\[math\]"):
        MathVerify()


@needs_math_verify
@pytest.mark.parametrize(
    ("reply", "answer", "correct", "parsed"),
    [("so it is \\boxed{\\frac{2}{4}}", "0.5", 1.0, 1.0), ("$x^2+1$", "1+x^2", 1.0, 1.0),
     ("The answer is 42.", "42", 1.0, 1.0), ("\\boxed{43}", "42", 0.0, 1.0),
     ("\\boxed{(1,2)}", "(1, 2)", 1.0, 1.0), ("\\boxed{7}", ["6", "7"], 1.0, 1.0),
     ("I do not know", "42", 0.0, 0.0)],
)
def test_math_verify_in_a_thread(reply, answer, correct, parsed):
    from rlvr.envs.graders.math import MathVerify

    score = MathVerify(isolation="thread").reward_fn(convo(reply), answer)
    assert score.value == correct
    assert score.metrics == {"correct": correct, "parsed": parsed, "timeout": 0.0}


@needs_math_verify
def test_math_verify_unparsable_gold_does_not_apply():
    from rlvr.envs.graders.math import MathVerify

    assert MathVerify(isolation="thread").reward_fn(convo("\\boxed{1}"), "\\frac{") is None


@needs_math_verify
def test_math_verify_timeout_gives_zero_and_the_timeout_metric(monkeypatch):
    import math_verify

    from rlvr.envs.graders.math import MathVerify

    calls = []

    def slow_verify(*args, **kwargs):
        calls.append(kwargs.get("timeout_seconds", "missing"))
        time.sleep(3)
        return True

    monkeypatch.setattr(math_verify, "verify", slow_verify)
    env = MathVerify(timeout=0.3, isolation="thread")
    start = time.perf_counter()
    score = env.reward_fn(convo("\\boxed{1}"), "1")
    elapsed = time.perf_counter() - start
    assert score.value == 0.0 and score.metrics == {"correct": 0.0, "parsed": 0.0, "timeout": 1.0}
    assert elapsed < 2.0
    assert calls == [None]  # math-verify's own (signal-based) timeout is disabled in the worker


@needs_math_verify
def test_math_verify_process_worker_off_the_main_thread():
    from rlvr.envs.graders.math import MathVerify

    env = MathVerify(timeout=30, isolation="process")
    results = {}

    def score(key, reply):
        results[key] = env.reward_fn(convo(reply), "\\frac{1}{2}")

    threads = [threading.Thread(target=score, args=(k, r)) for k, r in (("right", "\\boxed{0.5}"), ("wrong", "2"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    try:
        assert results["right"].value == 1.0 and results["right"].metrics["timeout"] == 0.0
        assert results["wrong"].value == 0.0 and results["wrong"].metrics["parsed"] == 1.0
    finally:
        env.close()


def test_process_worker_is_killed_on_timeout_and_restarted():
    from rlvr.envs.graders.math import _ProcessWorker
    from rlvr.errors import GradingTimeout

    worker = _ProcessWorker(time.sleep)
    try:
        assert worker.call((0,), timeout=60) is None
        first = worker._proc
        start = time.perf_counter()
        with pytest.raises(GradingTimeout, match="killed"):
            worker.call((30,), timeout=0.5)
        assert time.perf_counter() - start < 5
        assert not worker.alive and first.poll() is not None
        assert worker.call((0,), timeout=60) is None  # a fresh process answers the next call
        assert worker._proc is not first
    finally:
        worker.close()


@pytest.mark.parametrize(("kwargs", "match"), [({"timeout": 0}, "timeout"), ({"isolation": "fork"}, "isolation"),
                                               ({"workers": 0}, "workers")])
@needs_math_verify
def test_math_verify_bad_config(kwargs, match):
    from rlvr.envs.graders.math import MathVerify

    with pytest.raises(ValueError, match=match):
        MathVerify(**kwargs)


# ------------------------------------------------------------------------------ procedural tasks

TASKS = [countdown, reverse_text, sorting]


def test_new_tasks_are_registered():
    for module in TASKS:
        assert PROCEDURAL[module.NAME] == (module.__name__, {})
        assert procedural_task(module.NAME) == (module.make_rows, module.reward_fn)
        make_rows, reward = procedural_task(module.NAME)
        row = make_rows(1, seed=0)[0]
        assert reward(convo(row["answer"], row["prompt"]), row["answer"]) == 1.0


@pytest.mark.parametrize("module", TASKS, ids=lambda m: m.NAME)
def test_rows_are_deterministic_prefix_stable_and_leave_the_global_rng_alone(module):
    assert module.make_rows(30, seed=3) == module.make_rows(30, seed=3)
    assert module.make_rows(30, seed=3) != module.make_rows(30, seed=4)
    assert module.make_rows(7, seed=3) == module.make_rows(30, seed=3)[:7]
    random.seed(123)
    expected = random.random()
    random.seed(123)
    module.make_rows(20, seed=0)
    assert random.random() == expected


@pytest.mark.parametrize("module", TASKS, ids=lambda m: m.NAME)
def test_rows_are_terse_and_their_answers_score_one(module):
    rows = module.make_rows(300, seed=0)
    for row in rows:
        assert set(row) == {"prompt", "answer", "info"} and row["info"]["task"] == module.NAME
        assert row["prompt"].endswith("=") and len(row["prompt"]) <= 20
        assert len(row["answer"]) <= 12  # fits a tiny model's 16 new tokens at the default level
        assert module.reward_fn(convo(row["answer"], row["prompt"]), row["answer"]) == 1.0
        assert module.reward_fn(convo(f" {row['answer']}\n"), row["answer"]) == 1.0
        assert module.reward_fn(convo(row["answer"] + "0"), row["answer"]) == 0.0
    assert len({r["prompt"] for r in rows}) > 100


def test_reverse_text_rows_and_reward():
    rows = reverse_text.make_rows(200, seed=1)
    for row in rows:
        text = row["info"]["text"]
        assert row["prompt"] == f"rev:{text}=" and row["answer"] == text[::-1] and text != text[::-1]
        assert 3 <= len(text) <= 6 and text.isalpha() and text.islower()
    assert {len(r["info"]["text"]) for r in reverse_text.make_rows(200, seed=1, level=4)} <= set(range(8, 13))
    assert {len(r["info"]["text"]) for r in reverse_text.make_rows(50, seed=1, min_len=2, max_len=2)} == {2}
    assert reverse_text.make_rows(3, seed=0, alphabet="ab", min_len=4, max_len=4)[0]["info"]["text"] in {
        "".join(p) for p in __import__("itertools").product("ab", repeat=4)}
    answer = "dcba"
    assert reverse_text.reward_fn(convo("dcba"), answer) == 1.0
    assert reverse_text.reward_fn(convo("abcd"), answer) == 0.0
    assert reverse_text.reward_fn(convo("DCBA"), answer) == 0.0
    assert reverse_text.reward_fn(convo("dc ba"), answer) == 0.0  # unparsable: inner whitespace
    assert reverse_text.parse_answer("  ") is None and reverse_text.parse_answer(" ab\n") == "ab"


def test_sorting_rows_and_reward():
    for row in sorting.make_rows(200, seed=2):
        values = row["info"]["values"]
        assert row["prompt"] == "sort:" + ",".join(map(str, values)) + "="
        assert row["answer"] == ",".join(map(str, sorted(values))) and values != sorted(values)
        assert 3 <= len(values) <= 5 and all(0 <= v <= 9 for v in values)
    assert {len(r["info"]["values"]) for r in sorting.make_rows(100, seed=0, level=1)} <= {2, 3}
    assert max(max(r["info"]["values"]) for r in sorting.make_rows(100, seed=0, max_value=50)) > 9
    assert sorting.reward_fn(convo("1,2,3"), "1,2,3") == 1.0
    assert sorting.reward_fn(convo("1, 2, 3"), [3, 1, 2]) == 1.0
    assert sorting.reward_fn(convo("3,2,1"), "1,2,3") == 0.0
    assert sorting.reward_fn(convo("1,2"), "1,2,3") == 0.0
    assert sorting.reward_fn(convo("1,2,3,"), "1,2,3") == 0.0  # unparsable
    assert sorting.reward_fn(convo("[1,2,3]"), "1,2,3") == 0.0
    assert sorting.parse_answer("7") == [7] and sorting.parse_answer("a,b") is None
    with pytest.raises(ValueError, match="answer must be"):
        sorting.reward_fn(convo("1"), "x")


def test_countdown_rows_have_valid_reference_solutions():
    for row in countdown.make_rows(300, seed=5):
        info = row["info"]
        assert row["prompt"] == f"{info['target']} from {','.join(map(str, info['numbers']))}="
        value, used = countdown.parse_expression(row["answer"])
        assert value == info["target"] and sorted(used) == sorted(info["numbers"])
        assert info["target"] >= 1 and info["target"] not in info["numbers"]
        assert len(info["numbers"]) == 3 and all(1 <= x <= 9 for x in info["numbers"])
    assert all(len(r["info"]["numbers"]) == 4 for r in countdown.make_rows(20, seed=0, level=3))
    assert all(r["info"]["target"] <= 10 for r in countdown.make_rows(50, seed=0, max_target=10))


@pytest.mark.parametrize(
    ("reply", "reward"),
    [("3*5+7", 1.0), ("7+5*3", 1.0), ("(7+5*3)", 1.0), (" 5 * 3 + 7 ", 1.0), ("3*5+7=22", 0.0),
     ("3*5+7+0", 0.0),  # 0 is not a given number
     ("3*5+3*5-7-1", 0.0),  # reuses 3 and 5
     ("3*5*7", 0.0),  # valid but wrong value
     ("22", 0.0), ("5/0+22", 0.0), ("-3+25", 0.0), ("3**2", 0.0), ("__import__('os')", 0.0),
     ("3*5+7" + " " * 300, 1.0),  # surrounding whitespace is stripped first
     ("(" * 100 + "3*5+7" + ")" * 100, 0.0),  # over MAX_EXPRESSION_CHARS: not parsed at all
     ("", 0.0), ("3.0*5+7", 0.0), ("0x3*5+7", 0.0)],
)
def test_countdown_reward(reply, reward):
    assert countdown.reward_fn(convo(reply), "3*5+7") == reward


def test_countdown_exact_division_and_repeated_numbers_and_mapping_answers():
    puzzle = {"numbers": [4, 4, 6], "target": 10}
    assert countdown.reward_fn(convo("4+6"), puzzle) == 1.0  # at most once: 4 unused is fine
    assert countdown.reward_fn(convo("4/4+6+4-1"), puzzle) == 0.0  # 1 not given
    assert countdown.reward_fn(convo("(4+4)/4*6-2"), puzzle) == 0.0  # a third 4
    assert countdown.reward_fn(convo("2/3*9"), {"numbers": [2, 3, 9], "target": 6}) == 1.0  # exact fractions
    assert countdown.puzzle("(2+3)*4") == ([2, 3, 4], 20)
    assert countdown.parse_answer("3 * 5") == "3*5" and countdown.parse_answer("3*5=15") is None
    for bad in ("7/2", "hello", {"numbers": [1, True], "target": 3}, {"target": 3}, 22):
        with pytest.raises(ValueError, match="countdown"):
            countdown.reward_fn(convo("1"), bad)


@pytest.mark.parametrize(
    ("module", "kwargs", "field"),
    [(countdown, {"count": 1}, "count"), (countdown, {"count": 7}, "count"), (countdown, {"ops": ("^",)}, "ops"),
     (countdown, {"ops": ()}, "ops"), (countdown, {"max_number": 1}, "max_number"), (countdown, {"level": 9}, "level"),
     (countdown, {"max_target": 0}, "max_target"),
     (reverse_text, {"min_len": 0}, "min_len"), (reverse_text, {"min_len": 5, "max_len": 4}, "max_len"),
     (reverse_text, {"alphabet": "a b"}, "alphabet"), (reverse_text, {"alphabet": "aaa"}, "alphabet"),
     (reverse_text, {"min_len": 1}, "min_len"), (reverse_text, {"level": 0}, "level"),
     (sorting, {"min_len": 1}, "min_len"), (sorting, {"max_value": 0}, "max_value"),
     (sorting, {"max_value": -1}, "max_value"), (sorting, {"min_len": 4, "max_len": 3}, "max_len"),
     (sorting, {"level": "hard"}, "level")],
)
def test_bad_config_names_the_field(module, kwargs, field):
    with pytest.raises(ValueError, match=field):
        module.make_rows(3, seed=0, **kwargs)
    with pytest.raises(ValueError, match="n must be"):
        module.make_rows(-1, seed=0)


def test_unsatisfiable_countdown_options_say_so():
    with pytest.raises(ValueError, match="no usable target"):
        countdown.make_rows(1, seed=0, count=2, max_number=2, ops=("-",))


def test_arithmetic_levels_are_valid_arithmetic_options():
    from rlvr.envs.tasks import arithmetic

    for level, options in countdown.ARITHMETIC_LEVELS.items():
        rows = arithmetic.make_rows(50, seed=level, **options)
        assert all(len(r["answer"]) <= 12 for r in rows)
    assert arithmetic.make_rows(5, seed=0, **countdown.ARITHMETIC_LEVELS[2]) == arithmetic.make_rows(5, seed=0)
