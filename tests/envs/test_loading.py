"""The environment contract: Score, evaluate_reward, load_environment and interact (torch-free)."""

from __future__ import annotations

import math
import random
import textwrap
from decimal import Decimal
from fractions import Fraction

import pytest

from rlvr.envs import loading
from rlvr.envs.graders.exact_match import ExactMatch
from rlvr.envs.loading import load_environment
from rlvr.errors import ConfigError, EnvError, RewardError
from rlvr.protocols import Environment, LoadedEnv, MultiTurnEnvironment
from rlvr.reward import RewardResult, Score, evaluate_reward
from rlvr.rollouts.episodes import new_state


def convo(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": "q"}, {"role": "assistant", "content": text}]


# ------------------------------------------------------------------------------------------ Score


def test_score_value_is_the_weighted_sum_and_unweighted_components_are_metrics():
    score = Score({"correct": 1.0, "format": 0.5, "length": 120.0}, {"correct": 2.0, "format": 0.5})
    assert score.value == pytest.approx(2.25)  # length has no weight: recorded, never paid
    assert score.metrics == {"correct": 1.0, "format": 0.5, "length": 120.0}
    score.metrics["correct"] = 99.0  # a copy: the Score itself does not change
    assert score.components["correct"] == 1.0
    assert Score({"a": 3, "b": 1}, {"a": 1, "b": 0}).value == 3.0  # weight 0 = metric only


def test_score_of_pays_one_component():
    score = Score.of(0.75, parsed=1.0, tokens=12)
    assert score.value == 0.75
    assert score.metrics == {"reward": 0.75, "parsed": 1.0, "tokens": 12.0}
    with pytest.raises(ValueError, match="reward"):
        Score.of(1.0, reward=2.0)


@pytest.mark.parametrize(
    ("components", "weights", "match"),
    [
        ({"a": 1.0}, {}, "no weights"),
        ({"a": 1.0}, {"b": 1.0}, r"weights name no component: \['b'\]"),
        ({}, {}, "at least one component"),
        ({"a": True}, {"a": 1.0}, r"components\['a'\].*not bool"),
        ({"a": float("nan")}, {"a": 1.0}, "finite"),
        ({"a": 1.0}, {"a": float("inf")}, "finite"),
        ({"a": "1"}, {"a": 1.0}, "real number"),
        ({1: 1.0}, {1: 1.0}, "non-empty strings"),
        ([("a", 1.0)], {"a": 1.0}, "dict"),
    ],
)
def test_bad_scores_fail_at_construction(components, weights, match):
    with pytest.raises((TypeError, ValueError), match=match):
        Score(components, weights)


# -------------------------------------------------------------------------------- evaluate_reward


def test_evaluate_reward_reads_floats_ints_scores_and_none():
    assert evaluate_reward(lambda m, a: 0.5, convo("x"), "x") == RewardResult(0.5, {})
    assert evaluate_reward(lambda m, a: 1, convo("x"), "x").value == 1.0
    assert evaluate_reward(lambda m, a: Fraction(1, 4), convo("x"), "x").value == 0.25
    result = evaluate_reward(lambda m, a: Score({"c": 1.0, "p": 1.0}, {"c": 0.5}), convo("x"), "x")
    assert result.value == 0.5 and result.metrics == {"c": 1.0, "p": 1.0} and result.applies
    none = evaluate_reward(lambda m, a: None, convo("x"), "x")
    assert none.value is None and not none.applies and none.metrics == {}


def test_evaluate_reward_accepts_loaded_envs_objects_and_passes_messages_and_answer():
    seen = []

    class Env:
        def reward_fn(self, messages, answer):
            seen.append((messages, answer))
            return 1.0

    messages = convo("42")
    assert evaluate_reward(Env(), messages, "42").value == 1.0
    assert evaluate_reward(load_environment(Env()), messages, ["a"]).value == 1.0
    assert seen == [(messages, "42"), (messages, ["a"])]


@pytest.mark.parametrize(
    ("value", "named"),
    [(True, "True (bool)"), (False, "False (bool)"), (float("nan"), "nan"), (float("inf"), "inf"),
     (-float("inf"), "-inf"), ("1.0", "'1.0' (str)"), ([1.0], "[1.0] (list)"), (1 + 0j, "complex"),
     (Decimal("0.5"), "Decimal"), (10**400, "(int)")],
)
def test_evaluate_reward_rejects_non_rewards_naming_the_value(value, named):
    with pytest.raises(RewardError, match="expected|could not be read|bool") as info:
        evaluate_reward(lambda m, a: value, convo("x"), "x")
    assert named in str(info.value)


def test_evaluate_reward_wraps_exceptions_naming_env_and_exception():
    class Boom:
        name = "boom_env"

        def reward_fn(self, messages, answer):
            raise KeyError("no such field")

    with pytest.raises(RewardError, match=r"'boom_env' raised KeyError: 'no such field'") as info:
        evaluate_reward(Boom(), convo("x"), "x")
    assert isinstance(info.value.__cause__, KeyError)
    assert isinstance(info.value, EnvError)  # the environments' error family


def test_evaluate_reward_rejects_a_score_that_overflows():
    with pytest.raises(RewardError, match="Score"):
        evaluate_reward(lambda m, a: Score({"a": 1e308, "b": 1e308}, {"a": 1.0, "b": 1.0}), convo("x"), "x")


def test_keyboard_interrupt_is_not_swallowed():
    def stop(messages, answer):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        evaluate_reward(stop, convo("x"), "x")


class _BadRepr:
    def __repr__(self):
        raise RuntimeError("repr exploded")


class _BadFloat(float):
    def __float__(self):
        raise ValueError("float exploded")


class _BadClass:
    @property
    def __class__(self):
        raise RuntimeError("class exploded")


class _BadStr(Exception):
    def __str__(self):
        raise RuntimeError("str exploded")


class _Custom(Exception):
    pass


def _mutated_score() -> Score:
    score = Score({"a": 1.0}, {"a": 1.0})
    score.components["a"] = "not a number"  # type: ignore[assignment]
    return score


def _malformed_value(rng: random.Random):
    pick = rng.randrange(14)
    if pick == 0:
        return rng.choice([True, False])
    if pick == 1:
        return rng.choice([float("nan"), float("inf"), -float("inf"), math.copysign(float("nan"), -1)])
    if pick == 2:
        return "".join(rng.choice("0123456789.-e nan") for _ in range(rng.randrange(0, 8)))
    if pick == 3:
        return rng.choice([[], [rng.random()], (rng.random(),), {"reward": rng.random()}, {rng.random()}])
    if pick == 4:
        return complex(rng.random(), rng.random())
    if pick == 5:
        return rng.choice([Decimal(str(rng.random())), Decimal("NaN")])
    if pick == 6:
        return rng.choice([10**rng.randrange(309, 2000), -(10**rng.randrange(309, 2000))])
    if pick == 7:
        return _BadRepr()
    if pick == 8:
        return _BadFloat(rng.random())
    if pick == 9:
        return _BadClass()
    if pick == 10:
        big = 10.0 ** rng.randrange(305, 308)
        return Score({"a": big, "b": big}, {"a": 1e10, "b": 1e10})
    if pick == 11:
        return _mutated_score()
    if pick == 12:
        return rng.choice([b"1.0", bytearray(b"1"), object(), type, print, ...])
    return rng.choice([float, int, Score, RewardResult(1.0)])


_EXCEPTIONS = [ValueError, KeyError, TypeError, ZeroDivisionError, RecursionError, StopIteration, AttributeError,
               IndexError, RuntimeError, OSError, MemoryError, NotImplementedError, _BadStr, _Custom, RewardError,
               ConfigError, UnicodeError, ArithmeticError, AssertionError, LookupError]


def test_fuzz_malformed_rewards_and_raising_reward_functions_always_give_reward_error():
    rng = random.Random(20240613)
    cases = 0
    for i in range(1200):
        if i % 3 == 0:
            exc_type = rng.choice(_EXCEPTIONS)
            text = f"case {i}"

            def raising(messages, answer, exc_type=exc_type, text=text):
                raise exc_type(text)

            with pytest.raises(RewardError) as info:
                evaluate_reward(raising, convo("x"), "x")
            assert exc_type.__name__ in str(info.value)
            assert isinstance(info.value.__cause__, exc_type)
            if exc_type is not _BadStr and exc_type is not KeyError:
                assert text in str(info.value)
        else:
            value = _malformed_value(rng)
            with pytest.raises(RewardError) as info:
                evaluate_reward(lambda m, a, value=value: value, convo("x"), "x")
            message = str(info.value)
            assert type(value).__name__ in message or "Score" in message, message
            assert len(message) < 1500  # huge values are cut short in messages
        cases += 1
    assert cases >= 1000


# ----------------------------------------------------------------------------- load_environment


def write(tmp_path, name: str, source: str):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def test_import_path_module_with_reward_fn():
    env = load_environment("rlvr.envs.tasks.arithmetic")
    assert isinstance(env, LoadedEnv)
    assert env.name == "arithmetic" and env.spec == "rlvr.envs.tasks.arithmetic" and not env.multi_turn
    assert env.interact is None and env.make_rows is not None
    assert evaluate_reward(env, convo("82"), "82").value == 1.0
    assert env.describe() == {"type": "environment", "name": "arithmetic", "spec": "rlvr.envs.tasks.arithmetic",
                              "multi_turn": False}


def test_module_factory_class_and_attr_specs_get_kwargs():
    by_factory = load_environment("rlvr.envs.graders.exact_match", tags=True)
    by_class = load_environment("rlvr.envs.graders.exact_match:ExactMatch", tags=True)
    for env in (by_factory, by_class):
        assert env.name == "exact_match"
        assert evaluate_reward(env, convo("<answer>Paris</answer>"), "paris").value == 1.0
        assert evaluate_reward(env, convo("Paris"), "paris").metrics["parsed"] == 0.0
    plain = load_environment("rlvr.envs.graders.exact_match")
    assert evaluate_reward(plain, convo("Paris"), "paris").value == 1.0
    fn = load_environment("rlvr.envs.tasks.arithmetic:reward_fn")
    assert fn.name == "reward_fn" and evaluate_reward(fn, convo("3"), "3").value == 1.0


def test_file_specs_load_reward_fn_attr_and_dataclasses(tmp_path):
    path = write(tmp_path, "my_env.py", """
        from __future__ import annotations
        from dataclasses import dataclass

        @dataclass
        class Judge:
            gold: str = "yes"
            def reward_fn(self, messages, answer):
                return 1.0 if messages[-1]["content"] == self.gold else 0.0

        def reward_fn(messages, answer):
            return 0.25

        def load_environment(gold="yes"):
            return Judge(gold)
    """)
    env = load_environment(str(path), gold="ok")
    assert env.name == "Judge" and env.spec == str(path)
    assert evaluate_reward(env, convo("ok"), None).value == 1.0
    assert evaluate_reward(load_environment(f"{path}:reward_fn"), convo("ok"), None).value == 0.25
    assert evaluate_reward(load_environment(path), convo("yes"), None).value == 1.0  # PathLike, default kwargs


def test_file_without_reward_fn_names_the_file(tmp_path):
    path = write(tmp_path, "my_env.py", "X = 1\n")
    with pytest.raises(ConfigError, match=r"my_env\.py defines no reward_fn"):
        load_environment(str(path))
    with pytest.raises(ConfigError, match=r"my_env\.py defines no 'nope'"):
        load_environment(f"{path}:nope")


def test_file_that_merely_imports_load_environment_is_not_a_factory(tmp_path):
    path = write(tmp_path, "uses_api.py", """
        from rlvr.reward import Score
        from rlvr.envs.loading import load_environment
        def reward_fn(messages, answer):
            return Score.of(0.5)
    """)
    assert evaluate_reward(load_environment(str(path)), convo("x"), None).value == 0.5


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("no_such_module_for_rlvr_tests", "no module named 'no_such_module_for_rlvr_tests'"),
        ("rlvr.envs.no_such_env", "no module named 'rlvr.envs.no_such_env'"),
        ("rlvr.envs.tasks.arithmetic:nope", r"rlvr\.envs\.tasks\.arithmetic defines no 'nope'"),
        ("rlvr.envs", "defines no reward_fn"),
        ("", "empty"),
        ("not a spec!", "neither an import path"),
        ("missing_dir/env.py", "no such file"),
    ],
)
def test_bad_specs_name_the_spec_and_what_is_missing(spec, match):
    with pytest.raises(ConfigError, match=match):
        load_environment(spec)


def test_errors_raised_while_loading_are_reported(tmp_path):
    broken = write(tmp_path, "broken.py", "import rlvr_dependency_that_does_not_exist\n")
    with pytest.raises(ConfigError, match=r"broken\.py raised ModuleNotFoundError.*rlvr_dependency"):
        load_environment(str(broken))
    syntax = write(tmp_path, "syntax.py", "def reward_fn(:\n")
    with pytest.raises(ConfigError, match="SyntaxError"):
        load_environment(str(syntax))
    raising = write(tmp_path, "raising.py", """
        def load_environment(level=1):
            raise ValueError(f"level {level} is too hard")
    """)
    with pytest.raises(ConfigError, match="level 3 is too hard"):
        load_environment(str(raising), level=3)
    with pytest.raises(ConfigError, match=r"load_environment\(level=1\) does not accept \['depth'\]"):
        load_environment(str(raising), depth=3)


def test_kwargs_are_checked_against_the_factory():
    with pytest.raises(ConfigError, match=r"rlvr\.envs\.graders\.exact_match.*'colour'"):
        load_environment("rlvr.envs.graders.exact_match", colour="red")
    with pytest.raises(ConfigError, match=r"keyword arguments \['x'\].*takes none"):
        load_environment("rlvr.envs.tasks.arithmetic", x=1)
    with pytest.raises(ConfigError, match="takes none"):
        load_environment(lambda m, a: 1.0, x=1)


def test_objects_callables_and_loaded_envs():
    env = load_environment(ExactMatch(tags=True))
    assert env.name == "exact_match" and env.source.tags is True

    def my_reward(messages, answer):
        return 0.5

    bare = load_environment(my_reward)
    assert bare.name == "my_reward" and bare.reward_fn is my_reward and not bare.multi_turn
    assert load_environment(bare) is bare
    with pytest.raises(ConfigError, match="already built"):
        load_environment(bare, x=1)
    with pytest.raises(ConfigError, match="not an environment"):
        load_environment(42)


def test_reward_fn_with_the_wrong_signature_fails_at_load():
    def one_arg(messages):
        return 1.0

    with pytest.raises(ConfigError, match=r"reward_fn\(messages, answer, info\); its signature is \(messages\)"):
        load_environment(one_arg)

    class Env:
        reward_fn = "not callable"

    with pytest.raises(ConfigError, match="reward_fn is a str"):
        load_environment(Env())


def test_factory_returning_a_class_is_refused(tmp_path):
    path = write(tmp_path, "cls_env.py", """
        class E:
            def reward_fn(self, messages, answer):
                return 1.0
        def load_environment():
            return E
    """)
    with pytest.raises(ConfigError, match="returned the class E; return an instance"):
        load_environment(str(path))


# ------------------------------------------------------------------------------------- interact


class TwoArg:
    name = "guess"

    def reward_fn(self, messages, answer):
        return 1.0 if messages[-1]["content"] == answer else 0.0

    def interact(self, messages, state):
        state["seen"] = state.get("seen", 0) + 1
        if messages[-1]["content"] == state["answer"] or state["turn"] >= 3:
            return []
        return [{"role": "user", "content": "higher"}]


class OneArg:
    def reward_fn(self, messages, answer):
        return 0.0

    def interact(self, messages):
        return [{"role": "user", "content": f"you said {messages[-1]['content']}"}]


def test_two_argument_interact_gets_the_state_and_ends_with_an_empty_list():
    env = load_environment(TwoArg())
    assert env.multi_turn and isinstance(TwoArg(), MultiTurnEnvironment)
    state = new_state("7", {"level": 1})
    assert state == {"answer": "7", "info": {"level": 1}, "turn": 0}
    state["turn"] = 1
    assert env.interact(convo("3"), state) == [{"role": "user", "content": "higher"}]
    state["turn"] = 2
    assert env.interact(convo("7"), state) == []
    assert state["seen"] == 2  # the environment keeps its own keys in the state


def test_one_argument_interact_is_detected_once_at_load(monkeypatch):
    env = load_environment(OneArg())
    assert env.interact.arity == 1

    def no_more_inspection(*args, **kwargs):
        raise AssertionError("signature inspected per call")

    monkeypatch.setattr(loading.inspect, "signature", no_more_inspection)
    for _ in range(3):
        assert env.interact(convo("hi"), new_state("x")) == [{"role": "user", "content": "you said hi"}]


@pytest.mark.parametrize(
    ("returned", "match"),
    [(None, r"returned None .*\[\] when the conversation is done"), ("next", "list of messages"),
     ([{"content": "no role"}], "item 0"), ([{"role": "user"}], "item 0")],
)
def test_interact_must_return_a_list_of_messages(returned, match):
    class Env:
        def reward_fn(self, messages, answer):
            return 0.0

        def interact(self, messages, state):
            return returned

    env = load_environment(Env())
    with pytest.raises(EnvError, match=match):
        env.interact(convo("x"), new_state("a"))


def test_bad_interact_signatures_fail_at_load():
    class NoArgs:
        def reward_fn(self, messages, answer):
            return 0.0

        def interact(self):
            return []

    class Async:
        def reward_fn(self, messages, answer):
            return 0.0

        async def interact(self, messages, state):
            return []

    with pytest.raises(ConfigError, match=r"interact must accept \(messages, state\) or \(messages\)"):
        load_environment(NoArgs())
    with pytest.raises(ConfigError, match="async"):
        load_environment(Async())


def test_protocols_describe_the_built_ins():
    assert isinstance(ExactMatch(), Environment)
    assert not isinstance(ExactMatch(), MultiTurnEnvironment)
    assert not isinstance(object(), Environment)
