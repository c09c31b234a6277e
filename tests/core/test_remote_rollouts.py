"""Remote rollouts with in-process fake workers (the real ones, HTTP and Ray, run the same contract in
tests/backends/test_rollout_worker.py and tests/e2e/test_ray_cluster.py): a run whose rows go to two
workers writes the local run's record; a worker that dies mid-run loses no row (the row runs again
elsewhere, with the same seeds, so the record is still the local one, plus the recorded loss); a worker
that answers again comes back; no worker left stops the run resumably. Rows, samples and exceptions
survive the wire unchanged."""

from __future__ import annotations

import asyncio
import math

import pytest

from rlvr.errors import AbortedError, RemoteRolloutError, RewardError, WorkerLost, WorkersLostError
from rlvr.rollouts.episodes import group_from_rollout_fn
from rlvr.rollouts.remote import RemoteRollouts, RowJob
from rlvr.rollouts.wire import job_from_wire, job_to_wire, outcome_from_wire, outcome_to_wire
from rlvr.testing import FakeRolloutFn
from rlvr.types import Rollout, StopReason, Task
from support.remote_rig import comparable, run


class FakeWorker:
    """A worker in this process: runs the row as a real worker does, through the wire both ways, and
    dies (every call after raises WorkerLost) once it has run ``dies_after`` rows."""

    def __init__(self, name: str, rollout_fn, dies_after: int | None = None):
        self.name, self.rollout_fn, self.dies_after = name, rollout_fn, dies_after
        self.rows: list[str] = []
        self.alive = True

    async def run_row(self, job: RowJob):
        if self.dies_after is not None and len(self.rows) >= self.dies_after:
            self.alive = False
        if not self.alive:
            raise WorkerLost("connection refused")
        job = job_from_wire(job_to_wire(job))
        outcomes = await group_from_rollout_fn(self.rollout_fn, job.sample_timeout_s)(
            job.task, len(job.seeds), job.version, lambda i: job.seeds[i])
        self.rows.append(job.task.id)
        return [outcome_from_wire(outcome_to_wire(o)) for o in outcomes]

    async def ping(self) -> bool:
        return self.alive

    def where(self) -> dict:
        return {"kind": "fake"}

    def close(self) -> None:
        pass


@pytest.mark.parametrize("offpolicy", [0, 2])
def test_rows_on_two_workers_write_the_local_runs_record(tmp_path, offpolicy):
    fn = FakeRolloutFn(0.5, seed=1)
    run(tmp_path / "local", fn, max_head_offpolicy_versions=offpolicy)
    workers = [FakeWorker("a", fn), FakeWorker("b", fn)]
    remote = RemoteRollouts(workers, log=lambda _m: None)
    run(tmp_path / "remote", remote, max_head_offpolicy_versions=offpolicy)
    assert comparable(tmp_path / "remote") == comparable(tmp_path / "local")
    assert workers[0].rows and workers[1].rows  # both took rows
    assert remote.describe()["workers"] == [{"name": "a", "kind": "fake"}, {"name": "b", "kind": "fake"}]


def test_a_worker_that_dies_mid_run_loses_no_row_and_the_loss_is_recorded(tmp_path):
    from rlvr.record.run_record import read_record

    fn = FakeRolloutFn(0.5, seed=1)
    run(tmp_path / "local", fn)
    dying, steady = FakeWorker("dying", fn, dies_after=4), FakeWorker("steady", fn)
    said: list[str] = []
    run(tmp_path / "remote", RemoteRollouts([dying, steady], revive_every_s=3600, log=said.append))
    assert comparable(tmp_path / "remote") == comparable(tmp_path / "local")  # every row trained as locally
    warnings = [e.data for e in read_record(tmp_path / "remote").of_kind("warning")]
    assert len(warnings) == 1 and warnings[0]["warning"] == "rollout_worker_lost"
    assert warnings[0]["worker"] == "dying" and warnings[0]["left_rotation"]
    assert warnings[0]["row"] in steady.rows and warnings[0]["row"] not in dying.rows
    assert said == [f"rollout workers: dying connection refused; row {warnings[0]['row']!r} sent to another worker"]


def test_a_worker_that_answers_again_comes_back_into_rotation():
    fn = FakeRolloutFn(0.5, seed=1)
    flaky, steady = FakeWorker("flaky", fn, dies_after=1), FakeWorker("steady", fn)
    remote = RemoteRollouts([flaky, steady], revive_every_s=0.0, log=lambda _m: None)
    task = Task("t1", ({"role": "user", "content": "1+1="},), "2", "h1")

    async def rows(n: int) -> None:
        for i in range(n):
            await remote.run(RowJob(task, 0, (i, i + 1), None))
            if i == 1:
                flaky.alive, flaky.dies_after = True, None  # restarted
            await asyncio.sleep(0.01)

    asyncio.run(rows(6))
    kinds = [w["warning"] for w in remote.take_warnings()]
    assert kinds == ["rollout_worker_lost", "rollout_worker_back"] and len(flaky.rows) >= 2


def test_no_worker_left_stops_the_run_resumably(tmp_path):
    fn = FakeRolloutFn(0.5, seed=1)
    workers = [FakeWorker("a", fn, dies_after=2), FakeWorker("b", fn, dies_after=2)]
    with pytest.raises(WorkersLostError, match=r"no rollout worker has answered for 0.2s \(a: connection refused; "
                                               r"b: connection refused\)"):
        run(tmp_path / "remote", RemoteRollouts(workers, give_up_after_s=0.2, revive_every_s=0.05,
                                                log=lambda _m: None))
    assert issubclass(WorkersLostError, AbortedError)  # recorded and checkpointed as an abort: resumable


def test_rows_samples_and_exceptions_survive_the_wire():
    task = Task("r/1", ({"role": "user", "content": "hi", "name": "x"},), {"k": [1, 2]}, "abc",
                info={"prompt_ids": [1, 2]}, env="math", conversational=False)
    job = RowJob(task, 3, (2**63 + 5, 7), 12.5, ({"url": "http://h:1", "model": "policy-v3", "served_version": 3},))
    assert job_from_wire(job_to_wire(job)) == job
    rollout = Rollout(task_id="r/1", prompt_ids=(1, 2), completion_ids=(3, 4, 5), logprobs=(-0.1, float("nan"), -1e-9),
                      text="x", messages=({"role": "assistant", "content": "x", "tool_calls": [{"id": 1}]},),
                      version=2, stop_reason=StopReason.LENGTH, loss_mask=(1, 0, 1), reward=0.5,
                      metrics={"parsed": 1.0}, token_roles=("", "tool", ""))
    back = outcome_from_wire(outcome_to_wire(rollout))
    assert math.isnan(back.logprobs[1]) and back.logprobs[::2] == rollout.logprobs[::2]
    assert back == Rollout(**{**{f: getattr(rollout, f) for f in rollout.__dataclass_fields__},
                              "logprobs": back.logprobs})
    segments = outcome_from_wire(outcome_to_wire([rollout, rollout]))
    assert [(r.completion_ids, r.token_roles) for r in segments] == [((3, 4, 5), ("", "tool", ""))] * 2
    assert outcome_from_wire(outcome_to_wire(None)) is None
    for exc in (ValueError("bad"), RewardError("reward raised"), TimeoutError("no sample within 1s")):
        got = outcome_from_wire(outcome_to_wire(exc))
        assert type(got) is type(exc) and str(got) == str(exc)

    class ToolCrashed(Exception):
        pass

    got = outcome_from_wire(outcome_to_wire(ToolCrashed("sandbox died")))
    assert isinstance(got, RemoteRolloutError) and type(got).__name__ == "ToolCrashed" and str(got) == "sandbox died"
    aborted = outcome_from_wire(outcome_to_wire(AbortedError("row 'r/1' sample 0: SystemExit")))
    assert isinstance(aborted, AbortedError)
