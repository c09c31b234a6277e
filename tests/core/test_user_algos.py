"""What users plug into the algorithm family: echo's token filter (hand-computed ce weights, every
bad return refused naming the row) and an :class:`~rlvr.algos.Algorithm` subclass of their own,
checked and trained on the fakes."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import pytest

from rlvr import GRPOConfig, RLLoop
from rlvr.algos import Algorithm, Echo
from rlvr.algos.base import Samples, broadcast
from rlvr.algos.custom import user_algorithm
from rlvr.errors import ConfigError, RLLoopError
from rlvr.testing import FakeRolloutFn, FakeTrainer, ScriptedEvaluator, exact_match, make_rows
from rlvr.types import Group, Rollout, Task

TASK = Task("row-1", ({"role": "user", "content": "2+2="},), "4", "h1")
ROLES = {"tool": 0.1, "user": 0.5}


def segment(ids: tuple[int, ...], mask: tuple[int, ...], roles: tuple[str, ...] | None, reward: float) -> Rollout:
    return Rollout(TASK.id, (1, 2), ids, (-0.5,) * len(ids), "x", TASK.messages, version=0, loss_mask=mask,
                   reward=reward, token_roles=roles)


def episode(reward: float) -> list[Rollout]:
    """Two turns: a tool answer (ids 11, 12) inside the first, a user reply (id 21) inside the second."""
    return [segment((10, 11, 12, 13), (1, 0, 0, 1), ("", "tool", "tool", ""), reward),
            segment((20, 21, 22), (1, 0, 1), ("", "user", ""), reward)]


def odd_ids(segments: tuple[Rollout, ...], parity: int = 1) -> list[list[bool]]:
    """Keep the tokens whose id has the given parity."""
    return [[t % 2 == parity for t in r.completion_ids] for r in segments]


# ---- echo's token filter ------------------------------------------------------------------------
def test_the_filter_narrows_the_role_selection_token_by_token():
    plain = Echo(roles=ROLES).assign(TASK, [episode(1.0), [segment((30, 31), (1, 1), None, 0.0)]])
    filtered = Echo(roles=ROLES, token_filter=odd_ids, import_path="f.py:odd_ids",
                    kwargs={"parity": 1}).assign(TASK, [episode(1.0), [segment((30, 31), (1, 1), None, 0.0)]])
    # without the filter: tool tokens at 0.1, the user token at 0.5
    assert [r.ce_weights for r in plain.rollouts] == [(0.0, 0.1, 0.1, 0.0), (0.0, 0.5, 0.0), None]
    # odd ids only: 11 (tool) stays, 12 (tool) goes, 21 (user) stays; the single turn has no env tokens
    assert [r.ce_weights for r in filtered.rollouts] == [(0.0, 0.1, 0.0, 0.0), (0.0, 0.5, 0.0), None]
    # the rl credit is the filter's business in no way
    assert [r.advantages for r in filtered.rollouts] == [r.advantages for r in plain.rollouts]
    # kwargs reach it: even ids keep only 12, so the user reply leaves ce entirely
    even = Echo(roles=ROLES, token_filter=odd_ids, import_path="f.py:odd_ids", kwargs={"parity": 0})
    assert [r.ce_weights for r in even.assign(TASK, [episode(1.0), episode(0.0)]).rollouts][:2] == [
        (0.0, 0.0, 0.1, 0.0), None]
    assert even.describe()["import_path"] == "f.py:odd_ids" and even.describe()["kwargs"] == {"parity": 0}


@pytest.mark.parametrize(("returns", "message"), [
    (lambda segs: [[True] * 4], r"row 'row-1' sample 0: algo.import_path 'f.py:g' must return one keep-mask per "
                                r"segment \(2\)"),
    (lambda segs: [[True] * 4, [True] * 2], r"sample 0: .*segment 1: the keep-mask has 2 entries for 3 completion"),
    (lambda segs: [[True] * 4, [True, 1, True]], r"segment 1: keep-mask\[1\] = 1 is not a bool"),
    (lambda segs: None, r"must return one keep-mask per segment"),
    (lambda segs: [[True] * 4, "yes"], r"segment 1: a keep-mask must be a list of bools"),
])
def test_a_filter_of_the_wrong_shape_stops_the_run_naming_the_row(returns, message):
    algo = Echo(roles=ROLES, token_filter=returns, import_path="f.py:g")
    with pytest.raises(RLLoopError, match=message):
        algo.assign(TASK, [episode(1.0), episode(0.0)])


# ---- an Algorithm subclass of the user's --------------------------------------------------------
class Contrast(Algorithm):
    """+scale on the tokens of every sample above the group's worst reward, −scale on the worst ones."""

    name: ClassVar[str] = "contrast"
    components: ClassVar[tuple[str, ...]] = ("rl",)

    def __init__(self, scale: float = 1.0):
        self.scale = scale

    def assign(self, task: Task, samples: Samples) -> Group:
        worst = min(float(s[-1].reward) for s in samples)  # type: ignore[arg-type]
        return Group(task, tuple(dataclasses.replace(r, advantages=broadcast(r, self.scale if s[-1].reward > worst
                                                                               else -self.scale))
                                 for s in samples for r in s))


def test_a_user_subclass_is_checked_then_built_with_its_kwargs():
    algo = user_algorithm(Contrast, "my_algo.py:Contrast", {"scale": 0.5})
    g = algo.credit(TASK, [[segment((1, 2), (1, 1), None, 1.0)], [segment((3,), (1,), None, 0.0)]])
    assert [r.advantages for r in g.rollouts] == [(0.5, 0.5), (-0.5,)]
    assert algo.describe() == {"type": "contrast", "components": ["rl"], "import_path": "my_algo.py:Contrast"}
    with pytest.raises(ConfigError, match=r"algo.import_path='x.py:C': Contrast\(\*\*algo.kwargs\) failed"):
        user_algorithm(Contrast, "x.py:C", {"nope": 1})
    with pytest.raises(ConfigError, match=r"names <class 'dict'>, which is not a subclass of rlvr.algos.Algorithm"):
        user_algorithm(dict, "x.py:C", {})

    class NoAssign(Algorithm):
        name, components = "n", ("rl",)

    class BadComponents(Contrast):
        components = ("rl", "value")

    with pytest.raises(ConfigError, match=r"NoAssign must override assign"):
        user_algorithm(NoAssign, "x.py:C", {})
    with pytest.raises(ConfigError, match=r"envs.a.algo.import_path='x.py:C': BadComponents.components"):
        user_algorithm(BadComponents, "x.py:C", {}, where="envs.a.algo")


def test_a_user_subclass_trains_in_the_loop_on_the_fakes():
    trainer = FakeTrainer()
    algo = user_algorithm(Contrast, "my_algo.py:Contrast", {"scale": 2.0})
    cfg = GRPOConfig(max_steps=3, tasks_per_step=4, group_k=2, heldout_every=3, corpus_min=10)
    RLLoop.from_reward(cfg, exact_match, make_rows(120, seed=3), rollout_fn=FakeRolloutFn(seed=3), trainer=trainer,
                       algorithm=algo, heldout_eval=ScriptedEvaluator({0: 0.1, 3: 0.2})).run()
    assert len(trainer.calls) == 3
    values = {a for call in trainer.calls for r in call.rollouts for a in r.advantages if a}
    assert values <= {2.0, -2.0} and -2.0 in values  # the user's credit is what the trainer received


# ---- frozen-sourced rows do not age -------------------------------------------------------------
class LaggingRolloutFn(FakeRolloutFn):
    """Every sample claims policy version 0, as a frozen model's (or a stale server's) would."""

    async def __call__(self, row):
        return dataclasses.replace(await super().__call__(row), version=0)


def lagging_run(algorithm: Algorithm, envs: bool = False) -> FakeTrainer:
    trainer = FakeTrainer()
    cfg = GRPOConfig(max_steps=3, tasks_per_step=4, group_k=2, heldout_every=3, corpus_min=10,
                     max_head_offpolicy_versions=0)
    RLLoop.from_reward(cfg, exact_match, make_rows(120, seed=4), rollout_fn=LaggingRolloutFn(seed=4), trainer=trainer,
                       algorithm=algorithm, heldout_eval=ScriptedEvaluator({0: 0.1, 3: 0.2})).run()
    return trainer


def test_a_frozen_model_s_rows_are_exempt_from_the_staleness_bound():
    from rlvr.algos import GRPO, SFT

    # a policy's sample from version 0 at step 2 (policy at version 1, offset bound 0) is refused ...
    with pytest.raises(RLLoopError, match=r"rollout sampled under policy version 0 but the policy is at version 1"):
        lagging_run(GRPO("grpo"))
    # ... the same sample from a frozen model (sft's source) is not: it carries no version and trains
    trainer = lagging_run(SFT({"name": "teacher"}))
    assert len(trainer.calls) == 3
    assert all(r.version is None and any(r.ce_weights) for call in trainer.calls for r in call.rollouts)
