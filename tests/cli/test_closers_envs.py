"""A run stops the environments it built from a spec (a hub environment's worker and its episode
programs) when it ends; what the caller built and handed over is the caller's to close."""

from __future__ import annotations

import pytest

from rlvr.protocols import LoadedEnv

pytest.importorskip("torch")

from rlvr.wiring.seams import env_closers  # noqa: E402


class Source:
    def __init__(self):
        self.closed = 0

    def close(self):
        self.closed += 1

    def reward_fn(self, messages, answer):
        return 0.0


def test_environments_built_from_a_spec_are_closed_with_the_run_and_handed_ones_are_not():
    built, handed, plain = Source(), Source(), Source()
    envs = [LoadedEnv(name="hub", reward_fn=built.reward_fn, spec="openenv:pkg.mod:Env", source=built),
            LoadedEnv(name="mine", reward_fn=handed.reward_fn, spec=None, source=handed),
            LoadedEnv(name="fn", reward_fn=lambda m, a: 0.0, spec="pkg.mod:reward", source=lambda m, a: 0.0)]
    closers = env_closers([*envs, built.reward_fn])  # a bare reward function, as Python callers may hand over

    assert len(closers) == 1
    closers[0]()
    assert (built.closed, handed.closed, plain.closed) == (1, 0, 0)
