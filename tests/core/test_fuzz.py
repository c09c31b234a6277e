"""Rewards that misbehave in every way, through the whole loop: a clear error or a counted skip,
never an unrelated exception, never a bad sample trained on."""

from __future__ import annotations

import math
import threading
from collections import Counter

import pytest

from rlvr import GRPOConfig, RLLoop, RLLoopError
from rlvr.reward import Score
from rlvr.seeding import rng_for
from rlvr.testing import FakeSampler, FakeTrainer, ScriptedEvaluator, make_rows

GOOD = 0.25


def _raise(exc):
    raise exc


BEHAVIOURS = [
    lambda: GOOD, lambda: GOOD, lambda: GOOD, lambda: Score.of(GOOD, parsed=1.0),
    lambda: _raise(ValueError("bad parse")), lambda: _raise(KeyError("answer")), lambda: 1 / 0,
    lambda: math.nan, lambda: math.inf, lambda: -math.inf, lambda: "1.0", lambda: True, lambda: [1.0],
    lambda: object(), lambda: 1 + 2j, lambda: None,
]


class ChaosReward:
    """Picks a behaviour per completion from a seeded draw; counts what it returned, per prompt
    (rewards run concurrently in worker threads, hence the lock)."""

    def __init__(self, seed: int):
        self.seed, self.calls, self.bad_by_prompt = seed, 0, Counter()
        self.lock = threading.Lock()

    def __call__(self, messages, answer):
        pick = rng_for(self.seed, "chaos", messages[-1]["content"], answer).randrange(len(BEHAVIOURS))
        with self.lock:
            self.calls += 1
            self.bad_by_prompt[messages[0]["content"]] += pick >= 4
        return BEHAVIOURS[pick]()


def run(seed: int, policy: str):
    trainer = FakeTrainer()
    reward = ChaosReward(seed)
    cfg = GRPOConfig(group_k=4, tasks_per_step=4, max_steps=6, heldout_every=6, corpus_min=20,
                     heldout_frac=0.25, seed=seed, on_sample_error=policy, min_group_size=1, max_oversample=4.0,
                     synchronous_training=True)
    loop = RLLoop.from_reward(cfg, reward, make_rows(60, seed=seed),
                              sampler=FakeSampler(0.5, policy=trainer, seed=seed), trainer=trainer,
                              heldout_eval=ScriptedEvaluator(lambda s: 0.0))
    return loop, trainer, reward


def test_a_thousand_misbehaving_rewards_are_counted_and_never_trained_on():
    total = 0
    for seed in range(12):
        loop, trainer, reward = run(seed, "drop")
        try:
            record = loop.run()
        except RLLoopError as exc:  # a batch of nothing but bad samples: a clear stop, also fine
            assert "were filtered" in str(exc)
            total += reward.calls
            continue
        total += reward.calls
        trained = [r for c in trainer.calls for r in c.rollouts]
        assert trained and all(r.reward == GOOD for r in trained)
        drops = [d for e in record.of_kind("step") for d in e.data["sample_drops"]]
        drops += record.finished.data["sample_drops_after_last_step"]
        # Synchronous: nothing is left half-scored at the end, so every reward call was judged.
        assert record.finished.data["unconsumed_rows"] == []
        assert len(drops) == sum(reward.bad_by_prompt.values())  # every bad return reported, one by one
        assert all(d["reason"] for d in drops)
    assert total >= 1000


@pytest.mark.parametrize("seed", range(8))
def test_the_fail_policy_stops_at_the_first_bad_reward_naming_it(seed):
    loop, trainer, reward = run(seed, "fail")
    with pytest.raises(RLLoopError, match=r"row '[^']+' sample \d+: reward_fn of .* (raised|returned)"):
        loop.run()
    assert all(r.reward == GOOD for c in trainer.calls for r in c.rollouts)
