"""Web pages against ``rlvr rollout-worker`` (the command itself, started with no key, as the
training run's docs start it): a cross-origin ``text/plain`` POST and a request under a foreign Host
(DNS rebinding) naming the factory ``os:system`` run nothing and get a 4xx naming the header; the key
the worker generated is required; a setup naming code outside the allowed folders and modules is
refused before anything is imported, also when an allowed factory would import it; an allowed
origin passes, CORS included; the training run's client reads the key from the file the worker
wrote (again after the worker restarted with a new one). Then the rules themselves
(:class:`~rlvr.backends.web_guard.WebRules`), which ``rlvr serve`` and ``rlvr proxy`` share (their
attacks: test_web_guard_servers.py)."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from rlvr.backends.rollout.http_service import HTTPRolloutService  # noqa: E402
from rlvr.backends.rollout.worker import WorkerCore  # noqa: E402
from rlvr.backends.web_guard import WebRules  # noqa: E402
from rlvr.errors import BackendError, ConfigError, RequestError, UsageError  # noqa: E402
from rlvr.rollouts.remote import RowJob  # noqa: E402
from rlvr.types import Task  # noqa: E402
from support.remote_rig import SPEC, Worker  # noqa: E402

PAGE = "http://evil.example"
FRIEND = "http://localhost:3000"


def touching(marker) -> dict:
    """The setup a hostile page sends: run a shell command (it creates ``marker``)."""
    return {"factory": "os:system", "kwargs": {"command": f"touch {marker}"}}


def post(url: str, path: str, body: dict, **headers: str) -> httpx.Response:
    return httpx.post(f"{url}{path}", content=json.dumps(body), headers=headers, timeout=30)


def refused(response: httpx.Response, status: int, header: str) -> str:
    assert response.status_code == status, (response.status_code, response.text[:300])
    error = response.json()["error"]
    assert error["param"] == header and error["message"], error
    return error["message"]


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    """``rlvr rollout-worker --url-file F --allowed-dir D --allowed-origin FRIEND``, no key given."""
    folder = tmp_path_factory.mktemp("worker")
    url_file = folder / "worker.url"
    env = {k: v for k, v in os.environ.items() if k != "RLVR_API_KEY"}
    proc = subprocess.Popen([sys.executable, "-m", "rlvr.cli", "rollout-worker", "--url-file", str(url_file),
                             "--allowed-dir", str(folder), "--allowed-origin", FRIEND], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not url_file.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() else ""
            time.sleep(0.05)
        printed = ""
        while "generated key" not in printed and len(printed) < 20000:
            printed += proc.stdout.readline()
        key_file = folder / "worker.url.key"
        yield SimpleNamespace(url=url_file.read_text(), key=key_file.read_text(), key_file=key_file,
                              printed=printed, folder=folder)
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_a_cross_origin_text_plain_post_runs_nothing(worker, tmp_path):
    marker = tmp_path / "pwned"
    auth = {"Authorization": f"Bearer {worker.key}"}
    # What a page's fetch(..., {mode: "no-cors", body}) sends; even a page that somehow held the key.
    for extra in ({}, auth):
        answer = post(worker.url, "/v1/rollouts/setup", touching(marker), **{"content-type": "text/plain",
                                                                             "origin": PAGE}, **extra)
        assert PAGE in refused(answer, 403, "Origin")
    answer = post(worker.url, "/v1/rollouts/setup", touching(marker), **{"content-type": "text/plain"}, **auth)
    assert "application/json" in refused(answer, 415, "Content-Type")
    time.sleep(0.5)
    assert not marker.exists()


def test_a_rebound_host_runs_nothing(worker, tmp_path):
    marker = tmp_path / "pwned"
    port = worker.url.rsplit(":", 1)[1]
    for host in (f"evil.example:{port}", "127.0.0.1.evil.example", "localhost.evil.example:80"):
        answer = post(worker.url, "/v1/rollouts/setup", touching(marker), host=host,
                      **{"content-type": "application/json", "authorization": f"Bearer {worker.key}"})
        assert "DNS rebinding" in refused(answer, 403, "Host")
    time.sleep(0.5)
    assert not marker.exists()


def test_the_generated_key_is_printed_written_for_its_user_only_and_required(worker, tmp_path):
    assert f"serving on {worker.url}" in worker.printed
    assert f"generated key {worker.key}" in worker.printed and "cluster.rollout_key_file" in worker.printed
    assert len(worker.key) >= 32 and stat.S_IMODE(worker.key_file.stat().st_mode) & 0o077 == 0
    assert httpx.get(f"{worker.url}/health").status_code == 200  # a probe needs no key
    for given in ({}, {"Authorization": "Bearer guess"}, {"Authorization": worker.key}):
        assert httpx.get(f"{worker.url}/version", headers=given).status_code == 401
        answer = post(worker.url, "/v1/rollouts/setup", touching(tmp_path / "x"),
                      **{"content-type": "application/json"}, **given)
        assert answer.status_code == 401 and not (tmp_path / "x").exists()
    assert httpx.get(f"{worker.url}/version", headers={"Authorization": f"Bearer {worker.key}"}).status_code == 200


def test_a_setup_naming_code_outside_the_allowed_modules_is_refused_before_it_runs(worker, tmp_path):
    marker = tmp_path / "pwned"
    json_auth = {"content-type": "application/json", "authorization": f"Bearer {worker.key}"}
    answer = post(worker.url, "/v1/rollouts/setup", touching(marker), **json_auth)
    assert "--allow-module" in refused(answer, 403, "factory")
    # rlvr's own loader is allowed, but not as a way to reach any other module.
    through_rlvr = {"factory": "rlvr.envs.loading:load_environment",
                    "kwargs": {"spec": "subprocess:Popen", "args": ["touch", str(marker)]}}
    answer = post(worker.url, "/v1/rollouts/setup", through_rlvr, **json_auth)
    assert "'subprocess'" in refused(answer, 403, "kwargs")
    time.sleep(0.5)
    assert not marker.exists()
    fake = {"factory": "rlvr.testing:FakeRolloutFn", "kwargs": {"skill": 0.5, "seed": 1}}
    assert post(worker.url, "/v1/rollouts/setup", fake, **json_auth).status_code == 200


def test_an_allowed_origin_and_the_workers_own_pass_with_cors(worker):
    fake = {"factory": "rlvr.testing:FakeRolloutFn", "kwargs": {"skill": 0.5, "seed": 2}}
    json_auth = {"content-type": "application/json", "authorization": f"Bearer {worker.key}"}
    answer = post(worker.url, "/v1/rollouts/setup", fake, origin=FRIEND, **json_auth)
    assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == FRIEND
    asked = httpx.options(f"{worker.url}/v1/rollouts/setup", headers={
        "origin": FRIEND, "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type"})
    assert asked.status_code == 204 and asked.headers["access-control-allow-origin"] == FRIEND
    assert "authorization" in asked.headers["access-control-allow-headers"]
    assert post(worker.url, "/v1/rollouts/setup", fake, origin=worker.url, **json_auth).status_code == 200
    not_asked = httpx.options(f"{worker.url}/v1/rollouts/setup",
                              headers={"origin": PAGE, "access-control-request-method": "POST"})
    refused(not_asked, 403, "Origin")


def test_the_training_runs_client_sends_the_key_from_the_key_file_and_rereads_it_after_a_restart(worker, tmp_path):
    from rlvr.wiring.scale.rollout_workers import check_key_file

    task = Task("t", ({"role": "user", "content": "1+2="},), "3", "h")
    service = HTTPRolloutService(worker.url, SPEC, key_file=str(worker.key_file))
    service.check()
    assert asyncio.run(service.run_row(RowJob(task, 0, (1,), None)))[0].task_id == "t"
    # A worker restarted on the same port and --url-file generated another key: the client reads it again.
    key_file = tmp_path / "w.url.key"
    key_file.write_text("first")
    first = Worker(api_key="first")
    service = HTTPRolloutService(first.url, SPEC, key_file=str(key_file))
    assert len(asyncio.run(service.run_row(RowJob(task, 0, (1, 2), None)))) == 2
    first.stop()
    key_file.write_text("second")
    second = Worker(port=first.port, api_key="second")
    try:
        assert len(asyncio.run(service.run_row(RowJob(task, 0, (3,), None)))) == 1 and second.core.rows == 1
        key_file.write_text("stale")  # a key that is not the worker's still stops the run, naming the refusal
        with pytest.raises(BackendError, match="HTTP 401"):
            asyncio.run(HTTPRolloutService(second.url, SPEC, key_file=str(key_file)).run_row(
                RowJob(task, 0, (4,), None)))
    finally:
        second.stop()
    key_file.write_text("")
    with pytest.raises(ConfigError, match="cluster.rollout_key_file=.* is empty"):
        check_key_file(str(key_file))


def test_a_run_configured_with_the_key_file_reaches_the_worker_and_one_without_is_told_where_to_put_it(
        worker, monkeypatch):
    from rlvr.config.run import run_config_from_dict
    from rlvr.types import SamplingParams
    from rlvr.wiring.scale.rollout_workers import remote_rollout_fn, start

    def rollouts(cluster: dict):
        cfg = run_config_from_dict({"cluster": cluster, "sampler": {"backend": "http"}})
        fleet = start(cfg, [], log=lambda _m: None)
        return remote_rollout_fn(fleet, cfg, cfg.task, None, worker.folder, SamplingParams(), log=lambda _m: None)

    monkeypatch.delenv("RLVR_API_KEY", raising=False)
    # each worker's /version is checked before step 0, with the key
    assert rollouts({"rollout_urls": [worker.url], "rollout_key_file": str(worker.key_file)}) is not None
    with pytest.raises(ConfigError, match=r"HTTP 401 .*cluster.rollout_key_file"):
        rollouts({"rollout_urls": [worker.url]})


def test_a_module_outside_the_allow_list_is_not_even_imported(tmp_path, monkeypatch):
    allowed, marker = tmp_path / "allowed", tmp_path / "imported"
    allowed.mkdir()
    code = f"open({str(marker)!r}, 'w').close()\n\ndef make():\n    return lambda *a: None\n"
    (tmp_path / "planted_mod.py").write_text(code)
    (tmp_path / "planted_file.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    core = WorkerCore([str(allowed)], ("rlvr",))
    for factory, param in [("planted_mod:make", "factory"), (f"{tmp_path}/planted_file.py:make", None),
                           ("planted_mod.sub:make", "factory")]:
        with pytest.raises(RequestError) as refusal:
            core.setup({"factory": factory, "kwargs": {}})
        assert refusal.value.status == 403 and (param is None or refusal.value.param == param)
    assert not marker.exists() and "planted_mod" not in sys.modules
    # Named by the operator (--allow-module planted_mod), it loads.
    assert WorkerCore([str(allowed)], ("rlvr", "planted_mod")).setup({"factory": "planted_mod:make"})
    assert marker.exists()
    sys.modules.pop("planted_mod", None)


# ---- the rules -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("rules", "accepted", "refused_hosts"), [
    (WebRules(), ["127.0.0.1:8000", "localhost:1", "LOCALHOST", "[::1]:5", "127.0.0.2:80"],
     ["evil.example:8000", "127.0.0.1.nip.io:8000", "localhost.evil.example", "10.0.0.5:80", "[::1", "",
      "127.0.0.1:99999", "a b:1", "user@127.0.0.1"]),
    (WebRules(key_required=True), ["localhost:8300"], ["evil.example:8300"]),  # loopback: the key is not enough
    (WebRules(bind="0.0.0.0"), ["localhost:8300", "10.0.0.5:8300", "[::1]:1"], ["node7.cluster:8300"]),
    (WebRules(bind="0.0.0.0", key_required=True), ["node7.cluster:8300", "10.0.0.5"], ["", "a/b"]),
    (WebRules(bind="10.0.0.5"), ["10.0.0.5:8300"], ["localhost:8300", "node7.cluster:8300"]),
    (WebRules(bind="10.0.0.5", key_required=True), ["node7.cluster:8300"], ["x y"]),
])
def test_the_host_rule(rules, accepted, refused_hosts):
    assert [h for h in accepted if rules.host_refusal(h) is not None] == []
    assert [h for h in refused_hosts if rules.host_refusal(h) is None] == []
    assert rules.host_refusal(None) is not None


def test_the_origin_rule():
    rules = WebRules(allowed_origins=("http://localhost:3000/", "https://app.example"))
    host = "127.0.0.1:8000"
    for passing in (None, "http://127.0.0.1:8000", "HTTP://127.0.0.1:8000", "http://LOCALHOST:3000",
                    "https://app.example:443"):
        assert rules.origin_refusal(passing, host) is None, passing
    for failing in ("http://127.0.0.1:8001", "http://evil.example", "null", "file://", "http://localhost:3001",
                    "http://app.example"):
        assert rules.origin_refusal(failing, host).status == 403, failing
    assert rules.origin_refusal("http://example.com", "example.com") is None  # the Host's default port
    for bad in ("localhost:3000", "http://x/app", "*", "ftp://x"):
        with pytest.raises(UsageError, match="rlvr proxy --allowed-origin"):
            WebRules(allowed_origins=(bad,), command="rlvr proxy")


def test_the_body_rule():
    from starlette.datastructures import Headers

    rules = WebRules()

    def status(method: str, **headers: str) -> int | None:
        refusal = rules.body_refusal(method, Headers(headers={k.replace("_", "-"): v for k, v in headers.items()}))
        return None if refusal is None else refusal.status

    assert status("POST", content_type="text/plain", content_length="9") == 415
    assert status("POST", content_type="application/x-www-form-urlencoded", content_length="0") == 415
    assert status("PUT", content_length="9") == 415  # a body without a type
    assert status("POST", transfer_encoding="chunked") == 415
    assert status("POST", content_type="multipart/form-data; boundary=x", content_length="9") == 415
    assert status("POST", content_type="application/json; charset=utf-8", content_length="9") is None
    assert status("POST") is None  # no body: nothing to read (POST /sessions/ID/close by hand)
    assert status("GET", content_type="text/plain", content_length="9") is None
