"""Scoring (the Scorer seam): rlvr serve's prompt_logprobs, EndpointScorer, the engine and the HTTP
sampler as scorers. Every implementation is held to the trainer's own number, ``token_logprobs`` at
temperature 1; every failure of a scoring endpoint is a named error within its bound."""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import contextmanager

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from rlvr.backends.model.io import load_model, token_logprobs  # noqa: E402
from rlvr.backends.model.policy import LoraSpec, Policy  # noqa: E402
from rlvr.backends.model.tiny import build_tiny_model  # noqa: E402
from rlvr.backends.sample import engine as engine_module  # noqa: E402
from rlvr.backends.sample.engine import InProcessEngine  # noqa: E402
from rlvr.backends.sample.http import HTTPGenerator  # noqa: E402
from rlvr.backends.sample.scoring import EndpointScorer  # noqa: E402
from rlvr.backends.serve.app import ModelHost, serve_in_thread  # noqa: E402
from rlvr.backends.serve.model_host import ServerPolicy  # noqa: E402
from rlvr.backends.serve.process import free_port  # noqa: E402
from rlvr.backends.sync.lanes import write_policy_version  # noqa: E402
from rlvr.errors import BackendError, ConfigError  # noqa: E402
from rlvr.types import SamplingParams  # noqa: E402

pytestmark = pytest.mark.train
NAME = "tiny"
PAIRS = [([9, 10, 80], [11, 12, 13, 14]), ([5], [6]), ([20, 21, 22, 23, 24, 25], [26, 27]), ([7, 8], [40])]


# ---- builders ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "base", hidden=32, layers=2, heads=2, seed=0)


@pytest.fixture(scope="module")
def adapter(base, tmp_path_factory):
    """A LoRA adapter whose B matrices are random, so its log-probs differ visibly from the base's."""
    folder = tmp_path_factory.mktemp("adapter") / "a"
    policy = Policy(str(base), lora=LoraSpec(rank=4), need_reference=False, seed=1)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        for name, w in policy.model.named_parameters():
            if "lora_B" in name:
                w.normal_(std=0.5)
    policy.model.save_pretrained(str(folder))
    write_policy_version(folder, 3)
    return folder


@pytest.fixture(scope="module")
def host(base, tmp_path_factory):
    return ModelHost(base, served_model_name=NAME,
                     policy=ServerPolicy(allowed_dirs=(str(tmp_path_factory.getbasetemp()),)))


@pytest.fixture(scope="module")
def url(host, adapter):
    with serve_in_thread(host, port=free_port()) as url:
        r = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "student", "lora_path": str(adapter)})
        assert r.status_code == 200, r.text
        yield url


@pytest.fixture(scope="module")
def model(base):
    return load_model(str(base))


@pytest.fixture(scope="module")
def adapted(base, adapter):
    from peft import PeftModel

    return PeftModel.from_pretrained(load_model(str(base)), str(adapter)).eval()


def reference(model, prompt, completion) -> list[float]:
    """The trainer's number: ``token_logprobs`` at temperature 1 over the joined sequence."""
    ids = torch.tensor([list(prompt) + list(completion)])
    with torch.no_grad():
        return token_logprobs(model, ids, torch.ones_like(ids))[0, len(prompt) - 1:].tolist()


def close(got, want, atol) -> bool:
    return len(got) == len(want) and torch.allclose(torch.tensor(got), torch.tensor(want), atol=atol)


def completions(url, **body):
    return httpx.post(f"{url}/v1/completions", json={"model": NAME, "max_tokens": 2, **body}, timeout=30)


# ---- rlvr serve: prompt_logprobs ---------------------------------------------------------------------
def test_prompt_logprobs_are_token_logprobs_in_vllms_shape(url, model, base):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base)
    prompt = [9, 10, 80, 11, 12, 13]
    r = completions(url, prompt=prompt, prompt_logprobs=0, temperature=0.5, n=2, seed=5, return_token_ids=True,
                    skip_special_tokens=False)
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert len(choices) == 2 and choices[0]["prompt_logprobs"] == choices[1]["prompt_logprobs"]
    entries = choices[0]["prompt_logprobs"]
    assert entries[0] is None and len(entries) == len(prompt)
    assert [list(e) for e in entries[1:]] == [[str(t)] for t in prompt[1:]]  # the prompt token only
    got = [e[str(t)]["logprob"] for e, t in zip(entries[1:], prompt[1:], strict=True)]
    assert close(got, reference(model, prompt[:1], prompt[1:]), 1e-5)  # temperature 1, not the request's 0.5
    ids = torch.tensor([prompt])
    with torch.no_grad():
        logp = model(input_ids=ids).logits[0].log_softmax(-1)
    for t, entry in enumerate(entries[1:], start=1):
        e = entry[str(prompt[t])]
        assert e["rank"] == int((logp[t - 1] >= logp[t - 1, prompt[t]]).sum())  # 1 = the most likely
        assert e["decoded_token"] == tokenizer.decode([prompt[t]])
    for choice in choices:  # the sampled completion still comes back, whichever tokens were drawn
        assert 1 <= len(choice["token_ids"]) <= 2 and choice["finish_reason"] in ("length", "stop")
        assert choice["text"] == tokenizer.decode(choice["token_ids"], skip_special_tokens=False) != ""


def test_prompt_logprobs_per_prompt_of_a_batch_and_of_one_token(url, model):
    prompts = [[9, 10, 80], [20, 21], [5]]
    r = completions(url, prompt=prompts, prompt_logprobs=0, n=2)
    choices = r.json()["choices"]
    assert len(choices) == 6
    for index, choice in enumerate(choices):
        prompt = prompts[index // 2]
        entries = choice["prompt_logprobs"]
        assert entries[0] is None and len(entries) == len(prompt)
        got = [e[str(t)]["logprob"] for e, t in zip(entries[1:], prompt[1:], strict=True)]
        assert close(got, reference(model, prompt[:1], prompt[1:]) if len(prompt) > 1 else [], 1e-5)
    assert completions(url, prompt=[9, 10]).json()["choices"][0]["prompt_logprobs"] is None  # only when asked


def test_prompt_logprobs_of_a_lora_adapter_are_the_adapters(url, adapted, model):
    prompt = [9, 10, 80, 11, 12]
    r = completions(url, model="student", prompt=prompt, prompt_logprobs=0)
    got = [e[str(t)]["logprob"] for e, t in zip(r.json()["choices"][0]["prompt_logprobs"][1:], prompt[1:],
                                                  strict=True)]
    assert close(got, reference(adapted, prompt[:1], prompt[1:]), 1e-5)
    assert not close(got, reference(model, prompt[:1], prompt[1:]), 1e-3)  # the adapter, not the base


@pytest.mark.parametrize("value", [2, 1, -1])
def test_prompt_logprobs_above_zero_are_refused_naming_the_field(url, value):
    r = completions(url, prompt=[1, 2], prompt_logprobs=value)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "prompt_logprobs" and "prompt_logprobs" in error["message"]


def test_prompt_logprobs_never_straddle_a_weight_reload(base, tmp_path):
    """Scores requested while the weights are reloaded answer wholly from one version's weights."""
    host = ModelHost(base, served_model_name=NAME, policy=ServerPolicy(allowed_dirs=(str(tmp_path),)))
    old = load_model(str(base))
    new = load_model(str(base))
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)
        for p in new.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    save_file({n: p.detach().contiguous() for n, p in new.named_parameters()}, str(tmp_path / "model.safetensors"))
    prompt = [9, 10, 80, 11, 12]
    want = {0: reference(old, prompt[:1], prompt[1:]), 1: reference(new, prompt[:1], prompt[1:])}
    jobs = [(prompt, SamplingParams(max_tokens=2), 0)]

    async def race():
        early = [asyncio.ensure_future(host.generate_scored(None, jobs, [prompt])) for _ in range(4)]
        for _ in range(3):  # the early batch takes the lock and is in the engine
            await asyncio.sleep(0)
        reload = asyncio.ensure_future(host.reload_weights(str(tmp_path), 1))
        await asyncio.sleep(0)  # the reload waits for the lock; requests made now wait for the reload
        late = [asyncio.ensure_future(host.generate_scored(None, jobs, [prompt])) for _ in range(4)]
        await reload
        return await asyncio.gather(*early, *late)

    try:
        answers = asyncio.run(race())
    finally:
        host.close()
    seen = set()
    for _, [(logprobs, ranks)], version in answers:
        assert version in want and close(logprobs, want[version], 1e-5), (version, logprobs)
        assert len(ranks) == len(logprobs)
        seen.add(version)
    assert seen == {0, 1}


# ---- the engine and the HTTP sampler as scorers ------------------------------------------------------
@pytest.mark.parametrize("tokens_per_pass", [8, None])
def test_engine_score_is_token_logprobs_and_batches_mixed_lengths(model, monkeypatch, tokens_per_pass):
    """Requests of one loop turn share passes (at most max_batch rows, SCORE_TOKENS padded tokens
    each; 8 puts most requests alone), and each reads back its own rows."""
    if tokens_per_pass:
        monkeypatch.setattr(engine_module, "SCORE_TOKENS", tokens_per_pass)
    engine = InProcessEngine(model, eos_ids={2}, pad_id=0, max_batch=3)

    async def all_at_once():
        return await asyncio.gather(*(engine.score(p, c) for p, c in PAIRS), engine.score([5, 6], []))

    try:
        *scores, empty = asyncio.run(all_at_once())
        alone = [asyncio.run(engine.score(p, c)) for p, c in PAIRS]
        with pytest.raises(BackendError, match="empty prompt"):
            asyncio.run(engine.score([], [5]))
    finally:
        engine.close()
    assert empty == []
    for (p, c), got, one in zip(PAIRS, scores, alone, strict=True):
        assert isinstance(got, list) and all(isinstance(x, float) for x in got)
        assert close(got, reference(model, p, c), 1e-5) and close(one, got, 1e-5)


def test_engine_scores_under_the_weights_it_samples(base):
    policy = Policy(str(base), lora=None, need_reference=False)
    engine = InProcessEngine.replica_of(policy)
    prompt, completion = PAIRS[0]
    try:
        before = asyncio.run(engine.score(prompt, completion))
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(3)
            for p in policy.model.parameters():
                p.add_(torch.randn_like(p) * 0.3)
        assert close(asyncio.run(engine.score(prompt, completion)), before, 0)  # a replica: not moved yet
        engine.publish(dict(policy.model.named_parameters()), 1)
        after = asyncio.run(engine.score(prompt, completion))
    finally:
        engine.close()
    assert close(after, reference(policy.model, prompt, completion), 1e-5) and not close(after, before, 1e-3)


def test_http_generator_scores_with_the_model_it_samples(url, adapted, model):
    gen = HTTPGenerator(url, "student")

    async def both():
        return await asyncio.gather(*(gen.score(p, c) for p, c in PAIRS))

    for (p, c), got in zip(PAIRS, asyncio.run(both()), strict=True):
        assert close(got, reference(adapted, p, c), 1e-5)
    gen.model = NAME  # a lane switching names: the next scores are the new model's
    p, c = PAIRS[0]
    assert close(asyncio.run(gen.score(p, c)), reference(model, p, c), 1e-5)


# ---- EndpointScorer ----------------------------------------------------------------------------------
def test_endpoint_scorer_is_token_logprobs(url, model):
    scorer = EndpointScorer(f"{url}/v1", NAME, max_concurrency=2)
    scorer.check("algo.model")

    async def both():
        return await asyncio.gather(*(scorer.score(p, c) for p, c in PAIRS))

    for _ in range(2):  # a fresh event loop each time: a pool and a semaphore per loop
        for (p, c), got in zip(PAIRS, asyncio.run(both()), strict=True):
            assert close(got, reference(model, p, c), 1e-5)
    assert scorer.calls == 2 * len(PAIRS) + 1
    assert scorer.describe() == {"type": "rlvr.backends.sample.scoring.EndpointScorer", "url": url, "model": NAME,
                                 "max_concurrency": 2, "timeout_s": 60.0, "retries": 3}
    scorer.close()


def test_check_names_the_field_for_a_wrong_model(url):
    with pytest.raises(ConfigError, match=r"algo\.model: .* does not serve a model named 'teacher'") as info:
        EndpointScorer(url, "teacher").check("algo.model")
    assert url in str(info.value)


def test_check_names_the_field_for_an_unreachable_port():
    dead = f"http://127.0.0.1:{free_port()}"
    start = time.monotonic()
    with pytest.raises(ConfigError, match=r"algo\.teacher_url: .*unreachable") as info:
        EndpointScorer(dead, "teacher", timeout_s=5.0).check("algo.teacher_url")
    assert dead in str(info.value) and time.monotonic() - start < 5.0  # one attempt, no retries


class StubServer:
    """An ASGI app answering every ``/v1/completions`` with ``answer(body) -> (status, json)``;
    records each request's body and the peak number in flight."""

    def __init__(self, answer, delay_s: float = 0.0):
        self.answer, self.delay_s, self.bodies, self.inflight, self.peak = answer, delay_s, [], 0, 0

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        raw, more = b"", True
        while more:
            message = await receive()
            raw, more = raw + message.get("body", b""), message.get("more_body", False)
        self.bodies.append(json.loads(raw) if raw else None)
        self.inflight += 1
        self.peak = max(self.peak, self.inflight)
        try:
            await asyncio.sleep(self.delay_s)
            status, payload = self.answer(self.bodies[-1])
        finally:
            self.inflight -= 1
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": json.dumps(payload).encode()})


def vllm_answer(body, logprob=lambda pos: -1.0 - pos):
    """vLLM's shape for a token-id prompt with ``prompt_logprobs=0``."""
    ids = body["prompt"]
    entries = [None] + [{str(t): {"logprob": logprob(i), "rank": 1, "decoded_token": "x"}}
                        for i, t in enumerate(ids[1:], start=1)]
    choice = {"index": 0, "text": "x", "logprobs": None, "finish_reason": "length", "stop_reason": None,
              "prompt_logprobs": entries}
    return 200, {"id": "cmpl-1", "object": "text_completion", "model": body["model"], "choices": [choice]}


@contextmanager
def stub(answer, **kwargs):
    """``with stub(answer) as (url, app)``: a :class:`StubServer` on a free port."""
    app = StubServer(answer, **kwargs)
    with serve_in_thread(app, port=free_port()) as url:
        yield url, app


def test_check_names_the_field_for_a_server_that_refuses_prompt_logprobs():
    refuse = {"error": {"message": "prompt_logprobs is not supported", "type": "BadRequestError",
                        "param": "prompt_logprobs", "code": 400}}
    with stub(lambda body: (400, refuse)) as (url, _):
        with pytest.raises(ConfigError, match=r"algo\.model: .*refused a prompt_logprobs request") as info:
            EndpointScorer(url, "m").check("algo.model")
    assert url in str(info.value) and "prompt_logprobs is not supported" in str(info.value)


def test_check_names_the_field_for_a_server_that_ignores_prompt_logprobs():
    def ignore(body):
        status, payload = vllm_answer(body)
        payload["choices"][0]["prompt_logprobs"] = None
        return status, payload

    with stub(ignore) as (url, _):
        with pytest.raises(ConfigError, match=r"algo\.model: .*does not answer prompt log-probs") as info:
            EndpointScorer(url, "m").check("algo.model")
    assert url in str(info.value)


def test_the_request_sent_and_the_positions_read_back():
    with stub(vllm_answer) as (url, app):
        got = asyncio.run(EndpointScorer(url, "teacher").score([1, 2, 3], [4, 5]))
    assert got == [-4.0, -5.0]  # prompt positions 3 and 4 of the joined ids (the stub answers -1 - position)
    assert app.bodies == [{"model": "teacher", "prompt": [1, 2, 3, 4, 5], "max_tokens": 1, "temperature": 0,
                           "prompt_logprobs": 0}]


@pytest.mark.parametrize("broken, what", [
    (lambda pos: float("nan") if pos == 4 else -1.0, "completion position 1 (prompt position 4, token 5)"),
    (lambda pos: None if pos == 3 else -1.0, "completion position 0 (prompt position 3, token 4)"),
])
def test_a_missing_or_non_finite_entry_names_the_position(broken, what):
    def answer(body):
        status, payload = vllm_answer(body, broken)
        text = json.dumps(payload).replace("NaN", '"NaN"')  # what a lax server might send
        return status, json.loads(text)

    with stub(answer) as (url, _):
        with pytest.raises(BackendError, match=r"scoring endpoint: POST .* \(model 'teacher'") as info:
            asyncio.run(EndpointScorer(url, "teacher").score([1, 2, 3], [4, 5]))
    assert what in str(info.value) and url in str(info.value)


def test_5xx_is_retried_and_concurrency_is_bounded():
    answers = iter([(503, {"error": {"message": "warming up"}})])

    def flaky(body):
        return next(answers, None) or vllm_answer(body)

    with stub(flaky, delay_s=0.05) as (url, app):
        scorer = EndpointScorer(url, "teacher", max_concurrency=3, backoff_s=0.01)

        async def many():
            return await asyncio.gather(*(scorer.score([1, 2], [3]) for _ in range(12)))

        outs = asyncio.run(many())
    assert outs == [[-3.0]] * 12 and scorer.retried == 1  # position 2 of [1, 2, 3]
    assert app.peak == 3  # twelve calls, never more than three in flight


def test_every_call_is_bounded_by_timeout_s():
    with stub(vllm_answer, delay_s=30.0) as (url, _):
        scorer = EndpointScorer(url, "teacher", timeout_s=0.3, retries=1, backoff_s=0.01)
        start = time.monotonic()
        with pytest.raises(BackendError, match="no answer within 0.3s"):
            asyncio.run(scorer.score([1, 2], [3]))
        assert time.monotonic() - start < scorer.max_call_s + 0.75
