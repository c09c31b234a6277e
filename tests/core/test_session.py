"""In-memory rows and functions named ``session:NAME`` go through the readers and loaders files and
import paths take; a name outlives nothing, and a spec whose object is gone says what to do."""

from __future__ import annotations

import pytest

from rlvr.data.readers import read_tasks
from rlvr.envs.loading import load_environment, load_object
from rlvr.errors import ConfigError
from rlvr.session import lookup, registered


def reward(messages, answer):
    return 1.0


def test_objects_are_named_uniquely_for_the_block_only():
    other = [{"prompt": "x", "answer": "1"}]
    with registered({"data": [{"prompt": "q", "answer": "a"}], "reward": reward}) as outer:
        assert outer == {"data": "session:data", "reward": "session:reward"}
        with registered({"data": other, "reward": reward}) as inner:
            assert inner == {"data": "session:data~2", "reward": "session:reward"}  # the same object keeps its name
            assert lookup("session:data~2") is other
        assert lookup("session:reward") is reward  # still the outer block's
    with pytest.raises(ConfigError, match=r"'session:data' names an object .* resume=True"):
        lookup("session:data")


def test_readers_and_loaders_take_session_specs():
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(3)]
    with registered({"rows": rows, "reward": reward}) as specs:
        assert [t.answer for t in read_tasks(specs["rows"])] == ["1", "2", "3"]
        assert load_object(specs["reward"]) is reward
        env = load_environment(specs["reward"])
        assert env.name == "reward" and env.reward_fn is reward
