"""Every user callable is bounded, and stopping on purpose is a clean, resumable stop.

A reward that never returns, one that calls ``sys.exit``, Ctrl-C between or inside steps, a reward
of 1e154, a broken held-out reward under ``on_sample_error = "drop"``: each ends in a clear message
or a counted skip, and an aborted run resumes to the end with its ledger whole.
"""

from __future__ import annotations

import math
import sys
import threading
import time

import pytest

from conftest import make_rig, small_config
from rlvr import GRPOConfig, RLLoop, RLLoopError
from rlvr.errors import AbortedError, RewardError
from rlvr.reward import MAX_REWARD, evaluate_reward, evaluate_reward_within
from rlvr.run.evaluation import RolloutEvaluator
from rlvr.testing import FakeRolloutFn, FakeSampler, FakeTrainer, ScriptedEvaluator, exact_match, make_rows
from rlvr.types import Rollout


def hang_on(n: int, release: threading.Event):
    """A reward that never returns on its ``n``-th call (until the test releases it)."""
    calls = {"n": 0}
    lock = threading.Lock()

    def reward(messages, answer):
        with lock:
            calls["n"] += 1
            mine = calls["n"]
        if mine == n:
            release.wait(60)
        return exact_match(messages, answer)

    return reward


def test_a_reward_that_never_returns_is_a_counted_sample_error(tmp_path):
    release = threading.Event()
    cfg = small_config(max_steps=2, reward_timeout_s=0.2, on_sample_error="drop")
    rig = make_rig(cfg, out_dir=tmp_path, reward=hang_on(3, release))
    started = time.monotonic()
    record = rig.loop.run()
    release.set()
    assert time.monotonic() - started < 20
    drops = [d for e in record.of_kind("step") for d in e.data["sample_drops"]]
    drops += record.finished.data["sample_drops_after_last_step"]
    assert [d["reason"] for d in drops if "reward_timeout_s" in d["reason"]] == [
        "reward_fn of 'reward' did not return within reward_timeout_s=0.2s"]


def test_under_the_fail_policy_a_hung_reward_stops_the_run_naming_the_bound():
    release = threading.Event()
    rig = make_rig(small_config(max_steps=2, reward_timeout_s=0.2), reward=hang_on(1, release))
    with pytest.raises(RLLoopError, match=r"did not return within reward_timeout_s=0.2s"):
        rig.loop.run()
    release.set()


def test_held_out_rewards_and_rollouts_are_bounded_too():
    import asyncio

    release = threading.Event()
    rows = make_rows(4)
    from rlvr.data.tasks import load_tasks

    tasks = load_tasks(rows)
    fn = FakeRolloutFn(1.0)
    slow = RolloutEvaluator(fn, hang_on(2, release), reward_timeout_s=0.2)
    with pytest.raises(RLLoopError, match=r"held-out task .*reward_timeout_s=0.2s.*never drops held-out"):
        slow(0, tasks)

    async def stuck(row):
        await asyncio.sleep(3600)

    with pytest.raises(RLLoopError, match=r"held-out task .*rollout_timeout_s=0.1s"):
        RolloutEvaluator(stuck, exact_match, rollout_timeout_s=0.1)(0, tasks)
    release.set()


def test_drop_mode_never_reaches_held_out_evaluation():
    def broken_on_heldout(messages, answer):
        raise ValueError("no parse")

    fn = FakeRolloutFn(1.0)
    cfg = small_config(max_steps=2, on_sample_error="drop")
    loop = RLLoop.from_reward(cfg, exact_match, make_rows(40), rollout_fn=fn, trainer=FakeTrainer(),
                              heldout_eval=RolloutEvaluator(fn, broken_on_heldout))
    with pytest.raises(RLLoopError, match=r"held-out task .*no parse.*on_sample_error never drops held-out"):
        loop.run()


def test_a_reward_calling_sys_exit_stops_resumably_and_resume_finishes(tmp_path):
    cfg = small_config(max_steps=6, heldout_every=2, checkpoint_every=1)

    def exits_at_step_four(trainer):
        def reward(messages, answer):
            if trainer.version == 3:
                sys.exit(3)
            return exact_match(messages, answer)
        return reward

    trainer = FakeTrainer()
    rig = make_rig(cfg, out_dir=tmp_path, trainer=trainer, reward=exits_at_step_four(trainer))
    with pytest.raises(AbortedError, match=r"user code raised SystemExit\(3\).*rlvr resume"):
        rig.loop.run()
    cut = rig.loop.recorder.record()
    aborted = [e for e in cut.events if e.kind == "aborted"]
    assert len(aborted) == 1 and "SystemExit(3)" in aborted[0].data["reason"]
    assert cut.finished.data["stop_cause"] == "aborted"
    assert (tmp_path / "checkpoints" / "step_000003" / "loop_state.json").exists()

    again = make_rig(cfg, out_dir=tmp_path)
    record = again.loop.run(resume=True)
    assert record.finished.data["stop_cause"] == "max_steps"
    assert [e.step for e in record.of_kind("step")] == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("phase", ["between_steps", "inside_a_step"])
def test_ctrl_c_is_an_aborted_event_and_a_resumable_run(tmp_path, phase):
    cfg = small_config(max_steps=6, heldout_every=3)
    rig = make_rig(cfg, out_dir=tmp_path)
    if phase == "between_steps":
        def interrupt(progress):
            if progress.step == 5 and str(progress.phase) == "sample":
                raise KeyboardInterrupt
        rig.loop._explicit_hooks = (interrupt, None)
    else:
        real = rig.trainer.__class__.__call__

        def trainer_call(self, batch):
            if batch.step == 5:
                raise KeyboardInterrupt
            return real(self, batch)
        rig.trainer.__class__ = type("Interrupted", (FakeTrainer,), {"__call__": trainer_call})
    with pytest.raises(AbortedError, match=r"interrupted at step 5 \(Ctrl-C\)"):
        rig.loop.run()
    cut = rig.loop.recorder.record()
    kinds = [str(e.kind) for e in cut.events]
    assert kinds[-2:] == ["selected", "finished"] and kinds.count("aborted") == 1
    assert kinds[kinds.index("aborted") + 1:-2] == (["checkpoint"] if phase == "between_steps" else [])
    # Between steps the state is whole and checkpointed; inside a step it is not, and the last
    # checkpoint (step 3) is the one to resume from.
    last = sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*"))[-1]
    assert last == ("step_000004" if phase == "between_steps" else "step_000003")
    record = make_rig(cfg, out_dir=tmp_path).loop.run(resume=True)
    assert [e.step for e in record.of_kind("step")] == [1, 2, 3, 4, 5, 6]
    steps = record.of_kind("step")
    trained = sum(len(e.data["task_ids"]) for e in steps)
    filtered = sum(len(e.data["filtered"]) for e in steps) + len(record.finished.data["filtered_after_last_step"])
    unconsumed = len(record.finished.data["unconsumed_rows"])
    assert record.finished.data["rows_admitted"] == trained + filtered + unconsumed  # the whole run's ledger


def test_huge_rewards_are_refused_by_name():
    convo = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    assert evaluate_reward(lambda m, a: MAX_REWARD, convo, "a").value == MAX_REWARD
    for huge in (1e154, -1e154, 10 * MAX_REWARD):
        with pytest.raises(RewardError, match=r"returned .*beyond ±1e\+09.*scale the reward down"):
            evaluate_reward(lambda m, a, h=huge: h, convo, "a")
    with pytest.raises(RewardError, match="beyond"):
        evaluate_reward_within(lambda m, a: 1e300, convo, "a", timeout_s=5)
    # Through the loop: counted and dropped, never trained on, the advantages stay finite.
    cfg = GRPOConfig(group_k=4, tasks_per_step=3, max_steps=2, heldout_every=2, corpus_min=20, heldout_frac=0.25,
                     on_sample_error="drop", min_group_size=1, max_oversample=4.0)
    trainer = FakeTrainer()

    def sometimes_huge(messages, answer):
        return 1e154 if messages[-1]["content"] == answer else 0.0

    loop = RLLoop.from_reward(cfg, sometimes_huge, make_rows(40), sampler=FakeSampler(0.5, policy=trainer),
                              trainer=trainer, heldout_eval=ScriptedEvaluator(lambda s: 0.1))
    record = loop.run()
    trained: list[Rollout] = [r for c in trainer.calls for r in c.rollouts]
    assert all(r.reward == 0.0 for r in trained) and all(math.isfinite(a) for c in trainer.calls for a in c.advantages)
    drops = [d for e in record.of_kind("step") for d in e.data["sample_drops"]]
    assert drops and all("beyond" in d["reason"] for d in drops)


def _call(fn, answer="4"):
    return (fn, [{"role": "user", "content": "q"}, {"role": "assistant", "content": "4"}], answer, None)


def test_a_group_of_rewards_overrunning_in_the_middle_loses_only_that_one_and_runs_each_once():
    release, ran = threading.Event(), []

    def reward(messages, answer):
        ran.append(answer)
        if answer == "hang":
            release.wait(60)
        return float(answer == "4")

    from rlvr.reward import evaluate_rewards_within

    started = time.monotonic()
    out = evaluate_rewards_within([_call(reward), _call(reward, "hang"), _call(reward, "5"), _call(reward)], 0.3)
    release.set()
    assert time.monotonic() - started < 5
    assert [o.value for o in (out[0], out[2], out[3])] == [1.0, 0.0, 1.0]
    assert isinstance(out[1], RewardError) and "reward_timeout_s=0.3s" in str(out[1])
    assert sorted(ran) == sorted(["4", "hang", "5", "4"])  # the ones after the overrun ran once, elsewhere


def test_reward_threads_are_reused_not_started_per_reward():
    from rlvr.reward import evaluate_rewards_within

    def reward(messages, answer):
        return 1.0

    def threads():
        return {t for t in threading.enumerate() if t.name == "rlvr-reward"}

    evaluate_rewards_within([_call(reward)], 5.0)
    before = threads()
    for _ in range(50):
        assert [o.value for o in evaluate_rewards_within([_call(reward)] * 8, 5.0)] == [1.0] * 8
    assert len(threads() - before) <= 1  # the kept thread serves them all; not one thread per reward


def test_a_reward_exiting_in_a_group_reaches_the_caller_as_it_is():
    from rlvr.reward import evaluate_rewards_within

    def reward(messages, answer):
        if answer == "exit":
            sys.exit(3)
        return 1.0

    with pytest.raises(SystemExit):
        evaluate_rewards_within([_call(reward), _call(reward, "exit"), _call(reward)], 5.0)
