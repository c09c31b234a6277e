"""The algorithm family on fakes: the credit streams each algorithm writes, token by token, and the
run-level wiring (several environments with different algorithms in one batch)."""

from __future__ import annotations

import asyncio
import dataclasses
import math

import pytest

from rlvr import GRPOConfig, RLLoop
from rlvr.algos import GRPO, OPD, OPSD, SFT, AdvantageInputs, Custom, Echo, MaxRL, RawReward
from rlvr.errors import BackendError, ConfigError, RLLoopError
from rlvr.rollouts.checks import check_credit
from rlvr.run.inputs import LoopSeams
from rlvr.run.loop import EnvPlan
from rlvr.testing import FakeChatTokenizer, FakeRolloutFn, FakeTrainer, ScriptedEvaluator, exact_match, make_rows
from rlvr.types import Group, Rollout, Task

TASK = Task("row-1", ({"role": "user", "content": "2+2="},), "4", "h1")
TOK = FakeChatTokenizer()


def rollout(n: int, reward: float, mask: tuple[int, ...] | None = None, roles: tuple[str, ...] | None = None,
            prompt: tuple[int, ...] = (1, 2)) -> Rollout:
    return Rollout(TASK.id, prompt, tuple(range(10, 10 + n)), (-0.5,) * n, "x", TASK.messages, version=0,
                   loss_mask=mask, reward=reward, token_roles=roles)


def samples(*rewards: float, n: int = 3) -> list[list[Rollout]]:
    return [[rollout(n, r)] for r in rewards]


class FakeScorer:
    """Answers ``-0.1 * (position + 1)`` for every completion token and keeps the prompts it saw."""

    def __init__(self, short: bool = False):
        self.prompts: list[list[int]] = []
        self.short = short

    async def score(self, prompt_ids, completion_ids):
        self.prompts.append(list(prompt_ids))
        n = len(completion_ids) - (1 if self.short else 0)
        return [-0.1 * (t + 1) for t in range(n)]


# ---- group-time credit ----------------------------------------------------------------------
def test_grpo_broadcasts_the_group_relative_advantage_on_every_trainable_token():
    g = GRPO("grpo").assign(TASK, samples(1.0, 0.0, n=3))
    a = 0.5 / (math.sqrt(0.5) + 1e-6)  # (r − μ)/(σ + ε), σ unbiased
    assert g.rollouts[0].advantages == pytest.approx((a, a, a))
    assert g.rollouts[1].advantages == pytest.approx((-a, -a, -a))
    assert all(r.rl_weights is None and r.ce_weights is None and r.ref_kl_weights is None for r in g.rollouts)
    assert g.advantages == pytest.approx((a, -a))


def test_credit_is_zero_on_tokens_the_environment_added_and_shared_by_an_episodes_segments():
    first, last = rollout(3, 1.0, mask=(1, 0, 1)), rollout(2, 1.0, mask=(1, 1))
    g = GRPO("dr_grpo").assign(TASK, [[first, last], [rollout(2, 0.0)]])
    assert g.rollouts[0].advantages == (0.5, 0.0, 0.5)
    assert g.rollouts[1].advantages == (0.5, 0.5)
    assert g.rollouts[2].advantages == (-0.5, -0.5)


def test_max_rl_divides_by_the_success_rate_and_gives_nothing_without_success():
    g = MaxRL().assign(TASK, samples(1.0, 0.0, 0.0, 0.0, n=2))
    assert [r.advantages for r in g.rollouts] == [(3.0, 3.0), (-1.0, -1.0), (-1.0, -1.0), (-1.0, -1.0)]
    assert all(r.advantages == (0.0, 0.0) for r in MaxRL().assign(TASK, samples(0.0, 0.0, n=2)).rollouts)


def test_reward_is_the_raw_reward_with_no_baseline_and_needs_no_group():
    g = RawReward().assign(TASK, samples(0.7, n=2))
    assert g.rollouts[0].advantages == (0.7, 0.7)
    RawReward().check(1)
    with pytest.raises(ConfigError, match="loop.group_k = 1.*group-relative"):
        MaxRL().check(1)
    with pytest.raises(ConfigError, match="loop.advantage = 'rloo'"):
        GRPO("rloo").check(1)


def test_custom_gets_rewards_and_lengths_and_its_per_token_streams_are_checked():
    seen = []

    def alternate(inputs: AdvantageInputs, scale: float = 1.0) -> list[list[float]]:
        seen.append(inputs)
        return [[scale * (1 if t % 2 == 0 else -1) * r for t in range(n)]
                for r, n in zip(inputs.rewards, inputs.completion_lengths, strict=True)]

    algo = Custom(alternate, "tests:alternate", {"scale": 2.0})
    g = algo.assign(TASK, samples(1.0, 0.5, n=3))
    assert g.rollouts[0].advantages == (2.0, -2.0, 2.0) and g.rollouts[1].advantages == (1.0, -1.0, 1.0)
    assert seen[0].completion_lengths == (3, 3) and seen[0].broadcast([1, 2])[1] == [2.0, 2.0, 2.0]
    short = Custom(lambda inputs: [[0.0] * 2 for _ in inputs.rollouts], "tests:short")
    with pytest.raises(RLLoopError, match=r"row 'row-1'.*tests:short.*has 2 values for 3 completion tokens"):
        short.assign(TASK, samples(1.0, 0.0, n=3))
    nan = Custom(lambda inputs: [[math.nan] * 3 for _ in inputs.rollouts], "tests:nan")
    with pytest.raises(RLLoopError, match=r"not finite"):
        nan.assign(TASK, samples(1.0, 0.0, n=3))


# ---- distillation: ref_kl and ce routing, reference scoring ---------------------------------------
def test_opd_routes_every_sampled_token_to_ref_kl_and_takes_the_teachers_logprobs():
    scorer = FakeScorer()
    algo = OPD(scorer, {"name": "teacher"})
    g = algo.assign(TASK, [[rollout(3, 1.0, mask=(1, 0, 1))], [rollout(3, 1.0)]])
    r = g.rollouts[0]
    assert r.advantages is None and r.rl_weights == (0.0, 0.0, 0.0) and r.ref_kl_weights == (1.0, 0.0, 1.0)
    scored = asyncio.run(algo.score(g))
    assert scored.rollouts[0].ref_logprobs == pytest.approx((-0.1, -0.2, -0.3))
    assert scorer.prompts == [[1, 2], [1, 2]]  # the policy's own prompt: the teacher sees what the student saw
    for i, x in enumerate(scored.rollouts):
        check_credit(i, x)
    with pytest.raises(BackendError, match=r"row 'row-1' rollout 0: the reference scored 2 tokens of a 3-token"):
        asyncio.run(OPD(FakeScorer(short=True), "t").score(g))


def test_opsd_scores_after_the_prompt_with_the_demonstration_shown():
    scorer = FakeScorer()
    plain = TOK.render(TASK.messages)
    algo = OPSD(scorer, TOK)
    g = asyncio.run(algo.score(algo.assign(TASK, [[rollout(2, 0.0, prompt=tuple(plain))]])))
    shown = TOK.decode(scorer.prompts[0])
    assert shown.startswith("2+2=") and "example of a correct response:\n4" in shown
    assert g.rollouts[0].ref_logprobs == pytest.approx((-0.1, -0.2)) and g.rollouts[0].ref_kl_weights == (1.0, 1.0)
    elsewhere = algo.assign(TASK, [[rollout(2, 0.0, prompt=(9, 9))]])
    with pytest.raises(RLLoopError, match="opsd needs rollouts that start at the row's prompt"):
        asyncio.run(algo.score(elsewhere))


def test_sft_routes_sampled_tokens_to_ce_only():
    g = SFT({"name": "teacher"}).assign(TASK, [[rollout(3, 1.0, mask=(1, 1, 0))]])
    r = g.rollouts[0]
    assert r.ce_weights == (1.0, 1.0, 0.0) and r.rl_weights == (0.0, 0.0, 0.0) and r.advantages is None
    assert r.ref_kl_weights is None
    check_credit(0, r)


def test_echo_trains_environment_tokens_by_role_beside_grpo():
    roles = ("", "", "tool", "tool", "user", "")
    mixed = rollout(6, 1.0, mask=(1, 1, 0, 0, 0, 1), roles=roles)
    g = Echo().assign(TASK, [[mixed], [rollout(6, 0.0, roles=("",) * 6)]])
    assert g.rollouts[0].ce_weights == (0.0, 0.0, 0.1, 0.1, 0.0, 0.0)  # default table: tool at 0.1
    assert g.rollouts[0].advantages[0] > 0 and g.rollouts[0].advantages[2] == 0.0
    assert g.rollouts[1].ce_weights is None  # nothing the environment added
    custom = Echo(roles={"user": 1.0}).assign(TASK, [[mixed], [rollout(6, 0.0)]])
    assert custom.rollouts[0].ce_weights == (0.0, 0.0, 0.0, 0.0, 1.0, 0.0)  # the table is replaced whole


# ---- batch-time credit -------------------------------------------------------------------------
def test_reinforce_pp_whitens_the_reward_over_the_batchs_tokens():
    algo = GRPO("reinforce_pp")
    groups = [algo.assign(TASK, samples(1.0, n=3)), algo.assign(TASK, samples(0.0, n=1))]
    out = algo.finalize(groups)
    values = [a for g in out for r in g.rollouts for a in r.advantages]
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / len(values)
    assert mean == pytest.approx(0.0, abs=1e-9) and var == pytest.approx(1.0, rel=1e-6)
    assert values[:3] == pytest.approx([1 / math.sqrt(3)] * 3)  # token-weighted: the 3-token one weighs 3


def test_global_baseline_subtracts_the_batchs_mean_reward():
    algo = GRPO("global_baseline")
    out = algo.finalize([algo.assign(TASK, samples(1.0, n=2)), algo.assign(TASK, samples(0.0, 0.5, n=2))])
    assert [r.advantages for g in out for r in g.rollouts] == [(0.5, 0.5), (-0.5, -0.5), (0.0, 0.0)]


# ---- a run of several environments --------------------------------------------------------------
def test_two_environments_with_different_algorithms_share_every_batch():
    rows = [{**r, "id": f"a{i}"} for i, r in enumerate(make_rows(120, seed=1))]
    from rlvr.data.tasks import load_tasks

    tasks = [dataclasses.replace(t, env=env, id=f"{env}/{t.id}")
             for t in load_tasks(rows) for env in ("plain", "distil")]
    teacher = FakeScorer()
    plans = {"plain": EnvPlan(exact_match, FakeRolloutFn(seed=1), GRPO("grpo")),
             "distil": EnvPlan(exact_match, FakeRolloutFn(seed=2), OPD(teacher, "teacher"))}
    trainer = FakeTrainer()
    cfg = GRPOConfig(max_steps=3, tasks_per_step=8, group_k=2, heldout_every=3, corpus_min=10)
    loop = RLLoop(cfg, tasks, LoopSeams(plans, trainer, ScriptedEvaluator({0: 0.1, 3: 0.3})))
    loop.run()
    assert len(trainer.calls) == 3
    for call in trainer.calls:
        kinds = {r.task_id.split("/")[0] for r in call.rollouts}
        assert kinds == {"plain", "distil"}
        for r in call.rollouts:
            if r.task_id.startswith("distil/"):
                assert r.advantages is None and any(r.ref_kl_weights) and r.ref_logprobs is not None
            else:
                assert r.advantages is not None and r.ref_kl_weights is None
    assert teacher.prompts  # the teacher was asked, for the distil rows only


def test_a_run_of_several_environments_takes_envs_only():
    with pytest.raises(RLLoopError, match="envs=.*only"):
        RLLoop.from_reward(GRPOConfig(), exact_match, [], envs={"a": EnvPlan(exact_match, FakeRolloutFn())},
                           trainer=FakeTrainer(), heldout_eval=lambda s, t: 0.0)


def test_group_time_credit_of_a_filtered_group_is_never_scored():
    scorer = FakeScorer()
    algo = OPD(scorer, "t")
    g: Group = algo.assign(TASK, samples(1.0, 1.0))
    from rlvr.rollouts.stream import zero_variance_filter

    assert zero_variance_filter(g) is True  # distillation learns from equal rewards too
    assert zero_variance_filter(GRPO().assign(TASK, samples(1.0, 1.0))) != True  # noqa: E712


# ---- algo.weight ------------------------------------------------------------------------------
def test_a_weight_scales_every_component_weight_the_algorithm_assigns():
    plain = GRPO("grpo").credit(TASK, samples(1.0, 0.0, n=3))
    half = GRPO("grpo").with_weight(0.5).credit(TASK, samples(1.0, 0.0, n=3))
    for p, h in zip(plain.rollouts, half.rollouts, strict=True):
        assert p.rl_weights is None and h.rl_weights == (0.5, 0.5, 0.5)  # the mask, spelled out, times 0.5
        assert h.advantages == p.advantages and h.ce_weights is None and h.ref_kl_weights is None
    masked = OPD(FakeScorer(), "t").with_weight(0.1).credit(TASK, [[rollout(3, 1.0, mask=(1, 0, 1))]])
    (r,) = masked.rollouts
    assert r.ref_kl_weights == (0.1, 0.0, 0.1) and r.rl_weights == (0.0, 0.0, 0.0)
    sft = SFT({"name": "t"}).with_weight(2.0).credit(TASK, samples(1.0, n=2))
    assert sft.rollouts[0].ce_weights == (2.0, 2.0)
    assert OPD(FakeScorer(), "t").with_weight(0.1).describe()["weight"] == 0.1
    assert "weight" not in GRPO("grpo").describe()


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_a_weight_must_be_positive_and_finite(bad):
    with pytest.raises(ConfigError, match="algo.weight"):
        GRPO("grpo").with_weight(bad)
