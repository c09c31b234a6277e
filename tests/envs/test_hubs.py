"""The hub worker's protocol and the hub environments' refusals, with this interpreter standing in for
the hubs' Python (the hubs themselves run in the slow suite: tests/e2e/test_hub_envs.py)."""

from __future__ import annotations

import sys

import pytest

from rlvr.envs import environment
from rlvr.envs.hubs import HubEnv, HubWorker
from rlvr.errors import ConfigError, EnvError


def test_a_failed_request_names_the_hub_op_and_the_workers_error():
    worker = HubWorker(sys.executable)
    try:
        with pytest.raises(EnvError, match="'openenv' 'teleport' failed in the worker: ValueError: unknown hub op"):
            worker.call({"op": "teleport", "hub": "openenv", "spec": "x:Y"})
        with pytest.raises(EnvError, match="ModuleNotFoundError: No module named 'no_such_hub_module'"):
            worker.call({"op": "rows", "hub": "openenv", "spec": "no_such_hub_module:Env", "n": 1})
    finally:
        worker.close()
    with pytest.raises(EnvError, match="exited"):
        worker.call({"op": "rows", "hub": "openenv", "spec": "x:Y", "n": 1})


def test_hub_specs_are_checked_at_load():
    with pytest.raises(ConfigError, match="name the environment class"):
        environment("openenv:just_a_module")
    with pytest.raises(ConfigError, match="at least one turn"):
        environment("openenv:m:C", max_turns=0)
    with pytest.raises(ConfigError, match="name the taskset"):
        environment("verifiers-v1:")


def test_outside_an_episode_a_hub_row_is_checked_against_its_reference_answer():
    env = HubEnv("openenv", "m:C", {}, {})
    assert env.reward_fn([{"role": "assistant", "content": " 12\n"}], "12") == 1.0
    assert env.reward_fn([{"role": "assistant", "content": "13"}], "12") == 0.0
    assert env.reward_fn([{"role": "assistant", "content": "12"}], None) is None  # no reference: does not apply
