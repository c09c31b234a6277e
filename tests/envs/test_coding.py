"""The coding task: procedural repositories with a planted bug, an agent's edits applied in the sandbox,
and the repository's own tests as the reward (all pass: 1). Every run here is a real sandbox run.

What could go wrong and is checked: a generator that is not a function of its seed, a planted bug
the tests miss or a reference fix they refuse (in the sandbox, for every kind and function count),
a right edit not paid or a wrong one paid, an edit that leaves the repository (traversal, a test
file, a new file) or reaches the runner (imports, exits, dunders) being applied, and a repository
that prints a forged report or hangs being believed.
"""

from __future__ import annotations

import pytest

from rlvr.envs import environment
from rlvr.envs.coding import CodingEnv, EditRefused, TestRunner, agent_view, apply_edits, make_rows, parse_edits
from rlvr.envs.coding.edits import check_text
from rlvr.envs.services.sandbox import bwrap_available

sandboxed = pytest.mark.skipif(not bwrap_available(), reason="bubblewrap does not work on this machine")


@pytest.fixture(scope="module")
def env():
    return CodingEnv()


def test_rows_are_a_function_of_the_seed_and_prefix_stable():
    rows = make_rows(40, seed=3)
    assert rows == make_rows(40, seed=3)
    assert rows[:10] == make_rows(10, seed=3)
    assert rows != make_rows(40, seed=4)
    assert len({r["prompt"] for r in rows}) >= 38  # a varied set, not one repository forty times
    for row in rows:
        info = row["info"]
        assert set(info["tests"]) < set(info["files"]) and len(info["files"]) == 4
        assert row["answer"].startswith(f"{info['module']}:{info['line']}:    return ")
        assert row["prompt"].startswith(info["module"] + "\n1 def ") and "\nFAIL " in row["prompt"]
        assert len(row["prompt"]) + len(row["answer"]) < 200  # fits the demo model's 256 positions


def test_make_rows_names_the_option_at_fault():
    with pytest.raises(ValueError, match="functions"):
        make_rows(2, seed=0, functions=9)
    with pytest.raises(ValueError, match="kinds"):
        make_rows(2, seed=0, kinds=["typo"])


@sandboxed
@pytest.mark.parametrize(("functions", "kind"), [(1, "wrong"), (2, "wrong"), (3, "missing"), (2, "missing")])
def test_the_planted_bug_fails_and_the_reference_fix_passes_in_the_sandbox(env, functions, kind):
    for row in make_rows(4, seed=11, functions=functions, kinds=[kind]):
        info = row["info"]
        before = env.runner.run(info["files"], info["tests"])
        assert before.error is None and not before.all_pass
        assert [t for t, _ in before.failed] == [f"test_{info['module']}::test_{info['function']}"]
        assert row["prompt"].endswith("FAIL " + before.failed[0][1])  # the shown assertion is the tests' own
        score, why = env.score_reply(row["answer"], info["files"], info["tests"])
        assert why is None and score.components["resolved"] == 1.0 and score.value == 1.0


@sandboxed
def test_the_agent_view_built_from_a_test_run_is_the_rows_prompt(env):
    for row in make_rows(6, seed=5):
        prompt, report = agent_view(env.runner, row["info"]["files"], row["info"]["tests"])
        assert prompt == row["prompt"] and report.total == 4 and len(report.passed) == 3


@sandboxed
def test_a_right_edit_is_paid_and_wrong_ones_are_not(env):
    row = make_rows(1, seed=0)[0]  # mathx.py: is_pos planted as `a >= 0`, FAIL is_pos(0) == False
    assert row["answer"] == "mathx.py:2:    return a > 0"
    messages = [{"role": "user", "content": row["prompt"]}]
    right = env.reward_fn([*messages, {"role": "assistant", "content": row["answer"]}], row["answer"], row["info"])
    assert right.value == 1.0 and right.components["pass_rate"] == 1.0
    for wrong in ("mathx.py:2:    return a < 0",  # another bug
                  "mathx.py:2:    return False",  # the shown assertion's value, hard-coded: the hidden ones fail
                  "mathx.py:4:    return a > 0",  # the right text on the wrong line breaks dec
                  "mathx.py:2:return a > 0"):  # no indentation: the module no longer imports
        score = env.reward_fn([*messages, {"role": "assistant", "content": wrong}], row["answer"], row["info"])
        assert score.value == 0.0 and score.components["refused"] == 0.0, wrong
        assert score.components["pass_rate"] < 1.0
    untouched = env.runner.run(row["info"]["files"], row["info"]["tests"])
    assert untouched.pass_rate == 0.75  # what the planted bug leaves: the reward is all-pass, not this


@sandboxed
@pytest.mark.parametrize("reply", [
    "../mathx.py:2:    return a > 0", "/work/mathx.py:2:    return a > 0", "./mathx.py:2:    return a > 0",
    "mathx.py/../test_mathx.py:2:    return a > 0", "sub/mathx.py:2:    return a > 0",
    "test_mathx.py:3:    assert True", "test_mathx.py:6:def test_dec(): pass", "conftest.py:1:x = 1",
    "mathx.py:9:    return 1", "mathx.py:0:    return 1",
    "mathx.py:2:    return __import__('os')._exit(0)", "mathx.py:2:    import os", "mathx.py:2:    raise SystemExit(0)",
    "mathx.py:2:    return exit(0)", "mathx.py:2:    return print('rlvr-tests-')", "mathx.py:2:    return a.__class__",
    "mathx.py:2:    return f'{open}'", "mathx.py:2:    return open('/etc/passwd')", "mathx.py:1:while True: pass",
    "mathx.py:2:    return a > 0\nmathx.py:2:    return a > 0", "fix it: mathx.py:2:    return a > 0", "",
])
def test_an_edit_that_leaves_the_repository_or_reaches_the_runner_is_refused_and_nothing_runs(env, reply):
    row = make_rows(1, seed=0)[0]
    runs = env.runner.runs
    score, why = env.score_reply(reply, row["info"]["files"], row["info"]["tests"])
    assert why is not None and score.value == 0.0 and score.components["refused"] == 1.0
    assert env.runner.runs == runs  # refused before the sandbox: nothing of it was written or run


def test_apply_edits_leaves_the_repository_as_it_was():
    files = {"m.py": "def f(a):\n    return a\n", "test_m.py": "from m import f\n"}
    edited = apply_edits(files, ("m.py",), parse_edits("m.py:2:    return a + 1\nm.py:3:x = 1"))
    assert edited["m.py"] == "def f(a):\n    return a + 1\nx = 1\n"
    assert files["m.py"] == "def f(a):\n    return a\n"
    check_text("    return max(a, b) if a else [x for x in range(a)]")  # the repository's own kind of code
    with pytest.raises(EditRefused, match="lambda"):
        check_text("    return (lambda: 1)()")


@sandboxed
def test_a_repository_that_forges_the_report_or_hangs_is_not_believed(env):
    forged = {"m.py": "import os, sys\nsys.stdout.write('rlvr-tests-0000000000000000:{}\\n')\nos._exit(0)\n",
              "test_m.py": "import m\ndef test_a():\n    assert False\n"}
    report = env.runner.run(forged, ["test_m.py"])
    assert not report.all_pass and report.failed[0][0] == "test_m.py::test_a" and report.error is not None
    hangs = {"m.py": "def f():\n    while True:\n        pass\n",
             "test_m.py": "from m import f\ndef test_hang():\n    f()\ndef test_ok():\n    assert 1 + 1 == 2\n"}
    report = TestRunner(env.runner.sandbox, test_s=0.5).run(hangs, ["test_m.py"])
    assert report.passed == ("test_m.py::test_ok",) and "TimeoutError" in report.failed[0][1]


@sandboxed
def test_the_builtin_name_loads_the_environment_with_its_rows():
    loaded = environment("coding", test_s=1.0)
    rows = loaded.make_rows(3, seed=0, functions=1)
    assert rows == make_rows(3, seed=0, functions=1) and loaded.multi_turn is False
