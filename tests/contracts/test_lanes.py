"""The weight-sync contract, run over every lane: after ``publish(v)`` returns ``v``, the generator it
feeds samples from exactly the weights of version ``v`` and says so. In-process (live model and
replica), LoRA hot-load, disk reload and kill-and-restart must all pass the same assertions, and the
hot-load and disk lanes through SGLang's routes (``rlvr serve`` speaking them) with the SGLang generator."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("fastapi")
pytest.importorskip("httpx")


from rlvr.backends.model.policy import LoraSpec, Policy  # noqa: E402
from rlvr.backends.model.tiny import build_tiny_model  # noqa: E402
from rlvr.backends.sample.engine import InProcessEngine  # noqa: E402
from rlvr.backends.sample.http import HTTPGenerator  # noqa: E402
from rlvr.backends.sample.sglang import SGLangGenerator  # noqa: E402
from rlvr.backends.serve.app import ModelHost, serve_in_thread  # noqa: E402
from rlvr.backends.serve.model_host import ServerPolicy  # noqa: E402
from rlvr.backends.serve.process import free_port  # noqa: E402
from rlvr.backends.serve.sglang import SGLangApi  # noqa: E402
from rlvr.backends.sync.in_process import InProcessLane  # noqa: E402
from rlvr.backends.sync.lanes import DiskReloadLane, KillRestartLane, LoraHotLoadLane  # noqa: E402
from support.weights import GREEDY, PROMPT, local_greedy, train_step  # noqa: E402

pytestmark = pytest.mark.train
# kill-and-restart starts a server process per publish (about 5 s each): it runs with the slow suite.
LANES = ["in_process_live", "in_process_replica", "lora_hot_load", "disk_reload", "sglang_lora_hot_load",
         "sglang_disk_reload", pytest.param("kill_restart", marks=pytest.mark.slow)]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "base", hidden=32, layers=2, heads=2, seed=0)


@pytest.fixture(params=LANES)
def rig(request, base, tmp_path):
    """``(policy, publish, generator)`` for one lane; everything it started is stopped after."""
    lane_name, closers = request.param, []
    lora = LoraSpec(rank=4) if lane_name in ("lora_hot_load", "sglang_lora_hot_load", "kill_restart") else None
    policy = Policy(str(base), lora=lora, need_reference=False, seed=0)
    if lane_name == "in_process_live":
        gen = InProcessEngine(policy.model, eos_ids=policy.eos_ids, pad_id=policy.tokenizer.pad_token_id,
                              version=lambda: policy.version)
        publish = InProcessLane(gen)
        closers.append(gen.close)
    elif lane_name == "in_process_replica":
        gen = InProcessEngine.replica_of(policy)
        publish = InProcessLane(gen, policy)
        closers.append(gen.close)
    elif lane_name == "kill_restart":
        gen = HTTPGenerator("http://unset", "unset")
        publish = KillRestartLane(policy, tmp_path / "sync", generator=gen, threads=1, startup_timeout_s=120)
        closers.append(publish.close)
    else:
        host = ModelHost(base, served_model_name="tiny", policy=ServerPolicy(allowed_dirs=(str(tmp_path),)))
        server = serve_in_thread(host, port=free_port())
        url = server.__enter__()
        closers.append(lambda: server.__exit__(None, None, None))
        sglang = lane_name.startswith("sglang_")
        gen = SGLangGenerator(url, "tiny") if sglang else HTTPGenerator(url, "tiny")
        lane_cls = LoraHotLoadLane if lane_name.endswith("lora_hot_load") else DiskReloadLane
        publish = lane_cls(policy, url, tmp_path / "sync", keep=2, generator=gen, api=SGLangApi() if sglang else None)
        closers.insert(0, publish.close)
    yield policy, publish, gen
    for close in closers:
        close()


def test_each_publish_serves_exactly_the_published_weights(rig):
    policy, publish, gen = rig
    assert publish(0) == 0  # the base, before any sample (the loop publishes it first)
    seen = []
    for version in (1, 2, 3):
        train_step(policy, seed=version)
        assert publish(version) == version
        out = asyncio.run(gen.generate(PROMPT, GREEDY, seed=0))
        assert out.version == version
        assert out.ids == local_greedy(policy)  # the served weights are the trained ones
        seen.append(out.ids)
    assert len(set(seen)) > 1  # the outputs moved with the weights


def test_a_lane_describes_itself_for_the_run_record(rig):
    _policy, publish, _gen = rig
    described = publish.describe()
    assert isinstance(described, dict) and described.get("lane")
