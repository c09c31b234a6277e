"""The generator contract, run over every generator: the fake, the in-process engine, the HTTP
generator against ``rlvr serve``, the SGLang generator against ``rlvr serve``'s SGLang-native
``/generate``, and the server pool over two HTTP generators. Token in, token out: each
must answer the same assertions."""

from __future__ import annotations

import asyncio
import math

import pytest

from rlvr.testing import FakeGenerator
from rlvr.types import Completion, SamplingParams, StopReason

PROMPT = [9, 10, 80, 11]
GENERATORS = ["fake", "in_process", "http", "sglang", "pool"]


def _fake():
    # A scripted reply that depends on the seed, as a sampler's would.
    gen = FakeGenerator(lambda prompt, seed: "abcdefghij"[: 3 + seed % 5])
    return gen, lambda: None


def _in_process(base):
    from rlvr.backends.model.policy import Policy
    from rlvr.backends.sample.engine import InProcessEngine

    policy = Policy(str(base), lora=None, need_reference=False)
    engine = InProcessEngine(policy.model, eos_ids=policy.eos_ids, pad_id=policy.tokenizer.pad_token_id,
                             version=lambda: policy.version)
    return engine, engine.close


def _http(base):
    from rlvr.backends.sample.http import HTTPGenerator
    from rlvr.backends.serve.app import ModelHost, serve_in_thread
    from rlvr.backends.serve.process import free_port

    server = serve_in_thread(ModelHost(base, served_model_name="tiny"), port=free_port())
    url = server.__enter__()
    return HTTPGenerator(url, "tiny", timeout_s=30), lambda: server.__exit__(None, None, None)


def _sglang(base):
    from rlvr.backends.sample.sglang import SGLangGenerator
    from rlvr.backends.serve.app import ModelHost, serve_in_thread
    from rlvr.backends.serve.process import free_port

    server = serve_in_thread(ModelHost(base, served_model_name="tiny"), port=free_port())
    url = server.__enter__()
    return SGLangGenerator(url, "tiny", max_concurrency=8, timeout_s=30), lambda: server.__exit__(None, None, None)


def _pool(base):
    from rlvr.backends.sample.pool import ServerPool

    (a, close_a), (b, close_b) = _http(base), _http(base)
    return ServerPool([a, b], per_server=2, log=lambda _m: None), lambda: (close_a(), close_b())


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    pytest.importorskip("torch")
    from rlvr.backends.model.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "base", hidden=32, layers=2, heads=2, seed=0)


@pytest.fixture(scope="module", params=GENERATORS)
def generator(request):
    if request.param == "fake":
        gen, close = _fake()
    else:
        pytest.importorskip("torch")
        if request.param in ("http", "sglang", "pool"):
            pytest.importorskip("fastapi")
            pytest.importorskip("httpx")
        base = request.getfixturevalue("base")
        gen, close = {"in_process": _in_process, "http": _http, "sglang": _sglang, "pool": _pool}[request.param](base)
    yield gen
    close()


def generate(gen, params: SamplingParams, seed: int, prompt=PROMPT) -> Completion:
    return asyncio.run(gen.generate(prompt, params, seed=seed))


@pytest.mark.parametrize("max_tokens", [1, 4, 12])
def test_a_completion_aligns_token_by_token_within_its_budget(generator, max_tokens):
    out = generate(generator, SamplingParams(max_tokens=max_tokens, temperature=1.0), seed=3)
    assert isinstance(out, Completion)
    assert 1 <= len(out.ids) <= max_tokens
    assert len(out.logprobs) == len(out.ids)
    assert all(isinstance(i, int) and i >= 0 for i in out.ids)
    assert all(math.isfinite(lp) and lp <= 0.0 for lp in out.logprobs)
    assert out.stop_reason in (StopReason.STOP, StopReason.LENGTH)
    if out.stop_reason is StopReason.STOP:
        assert len(out.ids) <= max_tokens
    else:
        assert len(out.ids) == max_tokens
    assert out.version is None or (isinstance(out.version, int) and out.version >= 0)


def test_the_same_seed_draws_the_same_completion(generator):
    params = SamplingParams(max_tokens=8, temperature=1.0)
    a, b = generate(generator, params, seed=11), generate(generator, params, seed=11)
    assert a.ids == b.ids
    assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_different_seeds_draw_differently_somewhere(generator):
    params = SamplingParams(max_tokens=8, temperature=1.0)
    draws = {generate(generator, params, seed=s).ids for s in range(8)}
    assert len(draws) > 1


def test_greedy_does_not_depend_on_the_seed(generator):
    params = SamplingParams(max_tokens=8, temperature=0.0)
    if isinstance(generator, FakeGenerator):
        pytest.skip("a scripted generator answers what its script says; greediness is the script's")
    assert generate(generator, params, seed=1).ids == generate(generator, params, seed=2).ids


def test_concurrent_requests_each_get_an_answer(generator):
    params = SamplingParams(max_tokens=6, temperature=1.0)

    async def many():
        return await asyncio.gather(*(generator.generate(PROMPT, params, seed=s) for s in range(6)))

    outs = asyncio.run(many())
    assert len(outs) == 6 and all(isinstance(o, Completion) and len(o.ids) == len(o.logprobs) for o in outs)
