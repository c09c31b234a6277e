"""The SGLang sampler backend against ``rlvr serve`` speaking SGLang's native API: ``/generate`` in
SGLang's shapes, scoring through ``input_token_logprobs``, both weight-sync lanes through SGLang's
routes (``/update_weights_from_disk``, ``/load_lora_adapter``), and ``sampler.backend = "sglang"``
wired from a config. No SGLang runs here (its PyPI build needs CUDA); the protocol is what is tested."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from rlvr.backends.model.policy import LoraSpec, Policy  # noqa: E402
from rlvr.backends.model.tiny import build_tiny_model  # noqa: E402
from rlvr.backends.sample.http import HTTPGenerator  # noqa: E402
from rlvr.backends.sample.sglang import SGLangGenerator  # noqa: E402
from rlvr.backends.serve.app import ModelHost, serve_in_thread  # noqa: E402
from rlvr.backends.serve.model_host import ServerPolicy  # noqa: E402
from rlvr.backends.serve.process import free_port  # noqa: E402
from rlvr.backends.serve.sglang import SGLangApi, SGLangServer  # noqa: E402
from rlvr.backends.sync.lanes import DiskReloadLane, LoraHotLoadLane  # noqa: E402
from rlvr.errors import BackendError, ConfigError  # noqa: E402
from support.weights import GREEDY, PROMPT, local_greedy, train_step  # noqa: E402

pytestmark = pytest.mark.train


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "base", hidden=32, layers=2, heads=2, seed=0)


@pytest.fixture
def server(base, tmp_path_factory):
    host = ModelHost(base, served_model_name="tiny", policy=ServerPolicy(
        allowed_dirs=(str(tmp_path_factory.getbasetemp()),)))
    with serve_in_thread(host, port=free_port()) as url:
        yield url


def sample(gen, params=GREEDY, seed=0):
    return asyncio.run(gen.generate(PROMPT, params, seed=seed))


def test_generate_answers_in_sglangs_shapes(server):
    one = httpx.post(f"{server}/generate", json={"input_ids": PROMPT, "return_logprob": True, "logprob_start_len": 1,
                                                 "sampling_params": {"max_new_tokens": 5, "temperature": 0}}).json()
    meta = one["meta_info"]
    assert one["output_ids"] == [t for _, t, _ in meta["output_token_logprobs"]]
    assert meta["finish_reason"]["type"] in ("stop", "length") and meta["prompt_tokens"] == len(PROMPT)
    assert meta["completion_tokens"] == len(one["output_ids"]) and meta["weight_version"] == "0"
    assert [t for _, t, _ in meta["input_token_logprobs"]] == PROMPT[1:]  # from logprob_start_len on
    assert all(lp <= 0 for lp, _, _ in meta["input_token_logprobs"])
    many = httpx.post(f"{server}/generate", json={"input_ids": [PROMPT, PROMPT[:2]],
                                                  "sampling_params": {"max_new_tokens": 3, "n": 2}}).json()
    assert isinstance(many, list) and len(many) == 4 and "output_token_logprobs" not in many[0]["meta_info"]
    bad = httpx.post(f"{server}/generate", json={"input_ids": PROMPT, "sampling_params": {"max_new_tokenz": 3}})
    assert bad.status_code == 400 and "sampling_params.max_new_tokenz" in bad.text


def test_scores_match_the_openai_routes_prompt_logprobs(server):
    sglang, openai = SGLangGenerator(server, "tiny"), HTTPGenerator(server, "tiny")
    completion = [30, 31, 32]
    ours = asyncio.run(sglang.score(PROMPT, completion))
    assert len(ours) == 3 and ours == pytest.approx(asyncio.run(openai.score(PROMPT, completion)), abs=1e-6)


def test_a_body_without_token_logprobs_is_refused_naming_the_request():
    gen = SGLangGenerator("http://127.0.0.1:9", "tiny")
    with pytest.raises(BackendError, match="output_token_logprobs"):
        gen.completion({"text": "hi", "meta_info": {"finish_reason": {"type": "stop"}}}, "prompt of 4 tokens")
    with pytest.raises(BackendError, match="disagree"):
        gen.completion({"output_ids": [5], "meta_info": {"output_token_logprobs": [[-0.1, 6, None]]}}, "x")
    out = gen.completion({"meta_info": {"output_token_logprobs": [[None, 6, None]], "weight_version": "4",
                                        "finish_reason": {"type": "length", "length": 1}}}, "x")
    assert out.ids == (6,) and out.logprobs == (-9999.0,) and out.version == 4


def test_disk_reload_lane_through_update_weights_from_disk(server, base, tmp_path):
    policy = Policy(str(base), lora=None, need_reference=False)
    gen = SGLangGenerator(server, "tiny")
    lane = DiskReloadLane(policy, server, tmp_path / "sync", generator=gen, api=SGLangApi(), compatible=">=0.1,<1")
    before = sample(gen)
    train_step(policy, 7)
    assert lane(policy.version) == 1
    after = sample(gen)
    assert after.version == 1 and after.ids == local_greedy(policy) and after.ids != before.ids
    assert httpx.get(f"{server}/get_weight_version").json() == {"weight_version": "1"}
    refused = httpx.post(f"{server}/update_weights_from_disk", json={"model_path": "/nonexistent"})
    assert refused.status_code == 400 and refused.json()["success"] is False
    lane.close()


def test_lora_hot_load_lane_through_sglangs_adapter_routes(server, base, tmp_path):
    policy = Policy(str(base), lora=LoraSpec(rank=4), need_reference=False, seed=0)
    gen = SGLangGenerator(server, "tiny")
    lane = LoraHotLoadLane(policy, server, tmp_path / "sync", keep=2, generator=gen, api=SGLangApi(),
                           compatible=">=0.1,<1")
    seen = []
    for step in range(3):
        if step:
            train_step(policy, step)
        assert lane(policy.version) == policy.version
        out = sample(gen)  # the adapter goes out as lora_path
        assert gen.model == f"policy-v{policy.version}" and out.ids == local_greedy(policy)
        assert out.version == policy.version  # the adapter's version, not the base's weight_version label
        seen.append(out.ids)
    assert len(set(seen)) > 1
    assert [m["id"] for m in httpx.get(f"{server}/v1/models").json()["data"]] == ["tiny", "policy-v1", "policy-v2"]
    lane.close()


def test_backend_sglang_is_wired_from_a_config(server, base, tmp_path):
    from rlvr.config.run import run_config_from_dict
    from rlvr.wiring.sampler import sampler_side

    cfg = run_config_from_dict({"sampler": {"backend": "sglang", "url": server, "served_model_name": "tiny"},
                                "loop": {"lora_rank": 0}})
    policy = Policy(str(base), lora=None, need_reference=False)
    generator, publish, closers = sampler_side(cfg, policy, base, tmp_path)
    try:
        assert isinstance(generator, SGLangGenerator) and publish.api.name == "sglang"
        train_step(policy, 3)
        assert publish(policy.version) == 1 and sample(generator).ids == local_greedy(policy)
    finally:
        for close in closers:
            close()


def test_an_sglang_server_rlvr_starts_needs_sglangs_python(base, monkeypatch):
    from rlvr.config.run import run_config_from_dict
    from rlvr.wiring.sampler import make_server

    monkeypatch.delenv("RLVR_SGLANG_PYTHON", raising=False)
    cfg = run_config_from_dict({"sampler": {"backend": "sglang"}})
    policy = Policy(str(base), lora=None, need_reference=False)
    with pytest.raises(ConfigError, match="sampler.sglang_python"):
        make_server(cfg, policy, base, base / "server.log", base, 1)
    server = SGLangServer(base, python="/usr/bin/python3", lora_rank=8, served_model_name="policy")
    args = server.args()
    assert args[1:3] == ["-m", "sglang.launch_server"] and args[args.index("--max-lora-rank") + 1] == "8"
