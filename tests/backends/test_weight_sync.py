"""Weight-sync lanes: after each publish the sampler serves the new version and its outputs."""

from __future__ import annotations

import asyncio
import json
import os
import signal

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")


from rlvr.backends.model.policy import LoraSpec, Policy  # noqa: E402
from rlvr.backends.model.tiny import build_tiny_model  # noqa: E402
from rlvr.backends.sample.engine import InProcessEngine  # noqa: E402
from rlvr.backends.sample.http import HTTPGenerator  # noqa: E402
from rlvr.backends.serve.app import ModelHost, serve_in_thread  # noqa: E402
from rlvr.backends.serve.model_host import ServerPolicy  # noqa: E402
from rlvr.backends.serve.process import free_port  # noqa: E402
from rlvr.backends.sync.in_process import InProcessLane  # noqa: E402
from rlvr.backends.sync.lanes import DiskReloadLane, KillRestartLane, LoraHotLoadLane, check_server_version  # noqa: E402
from rlvr.errors import BackendError, ConfigError  # noqa: E402
from support.weights import GREEDY, PROMPT, local_greedy, train_step  # noqa: E402

pytestmark = pytest.mark.train


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "base", hidden=32, layers=2, heads=2, seed=0)


@pytest.fixture
def server(base, tmp_path_factory):
    """A fresh rlvr server over the base model, in this process; yields (url, host)."""
    host = ModelHost(base, served_model_name="tiny", policy=ServerPolicy(
        allowed_dirs=(str(tmp_path_factory.getbasetemp()),)))
    with serve_in_thread(host, port=free_port()) as url:
        yield url, host


def remote(gen: HTTPGenerator):
    return asyncio.run(gen.generate(PROMPT, GREEDY, seed=0))


def test_in_process_lane_live_and_replica(base):
    policy = Policy(str(base), lora=None, need_reference=False)
    live = InProcessEngine(policy.model, eos_ids=policy.eos_ids, pad_id=policy.tokenizer.pad_token_id,
                           version=lambda: policy.version)
    replica = InProcessEngine.replica_of(policy)
    try:
        assert InProcessLane()(3) == 3  # no engine: nothing to do
        train_step(policy, 1)
        assert InProcessLane(live)(1) == 1
        with pytest.raises(BackendError, match="serves policy version 1 after publishing version 2"):
            InProcessLane(live)(2)
        before = asyncio.run(replica.generate(PROMPT, GREEDY, seed=0))
        assert before.version == 0
        assert InProcessLane(replica, policy)(1) == 1
        after = asyncio.run(replica.generate(PROMPT, GREEDY, seed=0))
        assert after.version == 1 and after.ids == local_greedy(policy) and after.ids != before.ids
    finally:
        live.close()
        replica.close()


def test_lora_hot_load_lane(server, base, tmp_path):
    url, _host = server
    policy = Policy(str(base), lora=LoraSpec(rank=4), need_reference=False, seed=0)
    gen = HTTPGenerator(url, "tiny")
    lane = LoraHotLoadLane(policy, url, tmp_path / "sync", keep=2, generator=gen, compatible=">=0.1,<1")
    seen = []
    for step in range(4):
        if step:
            train_step(policy, step)
        assert lane(policy.version) == policy.version
        assert gen.model == f"policy-v{policy.version}"
        out = remote(gen)
        assert out.version == policy.version and out.ids == local_greedy(policy)
        seen.append(out.ids)
    assert len(set(seen)) > 1  # the outputs moved with the weights
    models = [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]]
    assert models == ["tiny", "policy-v2", "policy-v3"]  # keep=2: older versions unloaded...
    assert sorted(p.name for p in (tmp_path / "sync").iterdir()) == ["v2", "v3"]  # ...and deleted
    assert json.loads((tmp_path / "sync" / "v3" / "rlvr_version.json").read_text()) == {"policy_version": 3}
    assert lane.server_info["version"] and len(lane.seconds) == 4
    assert lane(3) == 3  # re-publishing a version (after a resume) replaces it
    lane.close()


def test_disk_reload_lane(server, base, tmp_path):
    url, _host = server
    policy = Policy(str(base), lora=None, need_reference=False)
    gen = HTTPGenerator(url, "tiny")
    lane = DiskReloadLane(policy, url, tmp_path / "sync", generator=gen)
    before = remote(gen)
    train_step(policy, 7)
    assert lane(policy.version) == 1
    out = remote(gen)
    assert out.version == 1 and out.ids == local_greedy(policy) and out.ids != before.ids
    assert sorted(p.name for p in (tmp_path / "sync").iterdir()) == ["v1"]
    with pytest.raises(ConfigError, match="LoraHotLoadLane"):
        DiskReloadLane(Policy(str(base), lora=LoraSpec(rank=4), need_reference=False), url, tmp_path)
    lane.close()


def fake_server(version_body, *, seen=None):
    """A transport for a server whose /version always answers ``version_body``."""

    def handle(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request.url.path)
        if request.url.path == "/version":
            return httpx.Response(200, json=version_body)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": "base"}]})
        return httpx.Response(200, text="Success")

    return httpx.MockTransport(handle)


def test_stale_server_is_detected(base, tmp_path):
    full = Policy(str(base), lora=None, need_reference=False)
    lane = DiskReloadLane(full, "http://server", tmp_path / "d",
                          transport=fake_server({"version": "0.1.0", "base_policy_version": 3}))
    with pytest.raises(BackendError, match="serves policy version 3 after publishing version 4: the server is stale"):
        lane(4)
    lora = Policy(str(base), lora=LoraSpec(rank=4), need_reference=False)
    rlvr_like = fake_server({"version": "0.1.0", "adapters": {"policy-v4": 2}})
    with pytest.raises(BackendError, match="serves policy version 2 under 'policy-v4' after publishing version 4"):
        LoraHotLoadLane(lora, "http://server", tmp_path / "l", transport=rlvr_like)(4)
    vllm_like = fake_server({"version": "0.11.0"})  # no policy versions: the versioned name must be listed
    with pytest.raises(BackendError, match="does not list adapter 'policy-v4'"):
        LoraHotLoadLane(lora, "http://server/v1", tmp_path / "v", transport=vllm_like)(4)
    with pytest.raises(BackendError, match="reports no policy version"):
        DiskReloadLane(full, "http://server", tmp_path / "n", transport=vllm_like)(4)
    assert DiskReloadLane(full, "http://server", tmp_path / "n", transport=vllm_like, verify=False)(4) == 4


def test_vllm_payloads(base, tmp_path):
    seen: list = []
    bodies: list = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        if request.method == "POST":
            bodies.append(json.loads(request.content))
        if request.url.path == "/version":
            return httpx.Response(200, json={"version": "0.11.0"})
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": "base"}, {"id": "policy-v1"}]})
        return httpx.Response(200, text="Success: LoRA adapter 'policy-v1' added successfully.")

    lora = Policy(str(base), lora=LoraSpec(rank=4), need_reference=False)
    lane = LoraHotLoadLane(lora, "http://vllm:8000/v1", tmp_path, transport=httpx.MockTransport(handle))
    assert lane(1) == 1
    assert seen == ["/v1/load_lora_adapter", "/version", "/v1/models"]
    assert bodies == [{"lora_name": "policy-v1", "lora_path": str((tmp_path / "v1").resolve())}]


def test_check_server_version():
    assert check_server_version({"version": "0.1.0"}, ">=0.1,<1") == "0.1.0"
    assert check_server_version({"version": "0.11.1.dev5+gabc123"}, ">=0.10") == "0.11.1.dev5+gabc123"
    with pytest.raises(BackendError, match=r"runs version '1.2.0', outside the compatible window '>=0.1,<1'"):
        check_server_version({"version": "1.2.0"}, ">=0.1,<1")
    with pytest.raises(BackendError, match="outside"):
        check_server_version({}, ">=0.1")
    with pytest.raises(ConfigError, match="not a version window"):
        check_server_version({"version": "0.1.0"}, "about 0.1")


def test_lane_refuses_server_outside_window(server, base, tmp_path):
    url, _host = server
    policy = Policy(str(base), lora=LoraSpec(rank=4), need_reference=False)
    with pytest.raises(BackendError, match="outside the compatible window '>=2'"):
        LoraHotLoadLane(policy, url, tmp_path, compatible=">=2")(0)


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_kill_restart_lane_restarts_a_dead_server(base, tmp_path, lora):
    policy = Policy(str(base), lora=LoraSpec(rank=4) if lora else None, need_reference=False)
    gen = HTTPGenerator("http://unset", "unset")
    lane = KillRestartLane(policy, tmp_path / "sync", generator=gen, threads=1, startup_timeout_s=120)
    try:
        assert lane(0) == 0
        first = remote(gen)
        assert first.version == 0 and first.ids == local_greedy(policy)
        os.kill(lane.server.proc.pid, signal.SIGKILL)  # the server dies between two steps
        lane.server.proc.wait(timeout=10)
        train_step(policy, 3)
        assert lane(1) == 1
        out = remote(gen)
        assert out.version == 1 and out.ids == local_greedy(policy)
        assert sorted(p.name for p in (tmp_path / "sync").iterdir()) == ["v1"]
    finally:
        lane.close()
    assert not lane.server.alive
