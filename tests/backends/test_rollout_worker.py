"""``rlvr rollout-worker`` over HTTP, two of them in threads of this process, running the fakes' rollout
function (``rlvr.testing:FakeRolloutFn``): a run whose rows go to them writes the local run's record; one
stopped mid-run loses no row; one restarted empty gets the run's setup again; the key and the allowed
folders are enforced. The Ray actor runs the same contract in tests/e2e/test_ray_cluster.py."""

from __future__ import annotations

import asyncio
from contextlib import contextmanager

import httpx
import pytest

from rlvr.backends.rollout.http_service import HTTPRolloutService
from rlvr.errors import BackendError
from rlvr.record.run_record import read_record
from rlvr.rollouts.remote import RemoteRollouts, RowJob
from rlvr.testing import FakeRolloutFn
from rlvr.types import Task
from support.remote_rig import SPEC, Worker, comparable, run


@contextmanager
def workers(n: int):
    started = [Worker() for _ in range(n)]
    try:
        yield started
    finally:
        for w in started:
            w.stop()


def test_rows_on_two_http_workers_write_the_local_runs_record(tmp_path):
    run(tmp_path / "local", FakeRolloutFn(0.5, seed=1))
    with workers(2) as (a, b):
        remote = RemoteRollouts([HTTPRolloutService(a.url, SPEC), HTTPRolloutService(b.url, SPEC)],
                                log=lambda _m: None)
        run(tmp_path / "remote", remote)
        assert a.core.rows and b.core.rows and a.core.rows + b.core.rows == 8 * 3  # steps x tasks_per_step
    assert comparable(tmp_path / "remote") == comparable(tmp_path / "local")
    described = read_record(tmp_path / "remote").run["seams"]["rollout_fn"]
    assert [w["url"] for w in described["workers"]] == [a.url, b.url]


def test_a_worker_stopped_mid_run_loses_no_row_and_one_restarted_gets_the_setup_again(tmp_path):
    run(tmp_path / "local", FakeRolloutFn(0.5, seed=1))
    with workers(2) as (a, b):
        services = [HTTPRolloutService(a.url, SPEC), HTTPRolloutService(b.url, SPEC)]
        remote = RemoteRollouts(services, revive_every_s=0.2, log=lambda _m: None)
        finish_row = a.core.run

        async def die_with_a_row_in_flight(sid, job):
            # After three rows, worker a goes down holding the next one (a thread stopping it from
            # outside could lose the race to the end of the run and find no row in flight).
            if a.core.rows >= 3:
                a.server.should_exit = True
                await asyncio.sleep(60)  # cut off by the server's shutdown: the row never answers
            return await finish_row(sid, job)

        a.core.run = die_with_a_row_in_flight
        run(tmp_path / "remote", remote)
    assert comparable(tmp_path / "remote") == comparable(tmp_path / "local")
    lost = [e.data for e in read_record(tmp_path / "remote").of_kind("warning")]
    assert lost and all(w["warning"] == "rollout_worker_lost" and w["worker"] == services[0].name for w in lost)
    # A worker restarted empty on the same port: the next row sends the setup first, then runs.
    fresh = Worker(port=a.port)
    try:
        task = Task("t", ({"role": "user", "content": "1+2="},), "3", "h")
        got = asyncio.run(services[0].run_row(RowJob(task, 0, (5, 6), None)))
        assert len(got) == 2 and fresh.core.rows == 1 and len(fresh.core.fns) == 1
    finally:
        fresh.stop()


def test_the_worker_wants_its_key_and_reads_only_allowed_folders(tmp_path):
    (tmp_path / "inside").mkdir()
    keyed = Worker(api_key="sesame", allowed_dirs=[str(tmp_path / "inside")])
    try:
        assert httpx.get(f"{keyed.url}/health").status_code == 200  # health needs no key
        refused = httpx.post(f"{keyed.url}/v1/rollouts/setup", json=SPEC)
        assert refused.status_code == 401 and "API key" in refused.json()["error"]["message"]
        outside = {"factory": "rlvr.testing:FakeRolloutFn", "kwargs": {"skill": 0.5, "note": str(tmp_path)}}
        answer = httpx.post(f"{keyed.url}/v1/rollouts/setup", json=outside,
                            headers={"Authorization": "Bearer sesame"})
        assert answer.status_code == 403 and "outside the folders this worker may read" in answer.text
        task = Task("t", ({"role": "user", "content": "1+2="},), "3", "h")
        with pytest.raises(BackendError, match="refused the run's setup with HTTP 401"):
            asyncio.run(HTTPRolloutService(keyed.url, SPEC, api_key="wrong").run_row(RowJob(task, 0, (1,), None)))
        got = asyncio.run(HTTPRolloutService(keyed.url, SPEC, api_key="sesame").run_row(RowJob(task, 0, (1,), None)))
        assert got[0].task_id == "t"
    finally:
        keyed.stop()
