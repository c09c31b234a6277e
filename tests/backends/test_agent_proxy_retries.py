"""The recording proxy records only what an agent saw: a request whose client timed out and retried
is never recorded (its generation is cancelled when the client leaves), a retry that arrives after
its earlier try was answered supersedes that try, an ``Idempotency-Key`` names one request across
its tries, and the same request sent twice on purpose is two calls."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("transformers")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from rlvr.backends.proxy.app import AgentProxy  # noqa: E402
from rlvr.types import SamplingParams  # noqa: E402
from support.chatml import ScriptedGenerator, smollm2_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def tok():
    return smollm2_tokenizer()


@pytest.fixture(scope="module")
def proxy(tok):
    p = AgentProxy(tok, max_len=2048)
    p.start()
    yield p
    p.stop()


class SlowAtFirst(ScriptedGenerator):
    """Answers after ``delays[k]`` seconds on its k-th call (0 past the list); counts the calls that
    were cancelled (their caller gone) and those that finished."""

    def __init__(self, tok, reply, delays):
        super().__init__(tok, reply)
        self.delays, self.started, self.cancelled, self.finished = list(delays), 0, 0, 0

    async def generate(self, prompt_ids, params, *, seed):
        k, self.started = self.started, self.started + 1
        try:
            await asyncio.sleep(self.delays[k] if k < len(self.delays) else 0.0)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        self.finished += 1
        return await super().generate(prompt_ids, params, seed=seed)


def test_a_client_that_times_out_and_retries_leaves_exactly_the_call_it_read(proxy, tok):
    gen = SlowAtFirst(tok, lambda prompt: "done", delays=[5.0, 5.0])
    sid, url = proxy.open(gen, SamplingParams(max_tokens=16), seed=1)
    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=2, timeout=0.5)
    out = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    assert out.choices[0].message.content == "done"
    deadline = time.monotonic() + 5
    while gen.cancelled < 2 and time.monotonic() < deadline:  # the proxy hears each disconnect
        time.sleep(0.02)
    done = proxy.close(sid)
    assert gen.started == 3 and gen.cancelled == 2 and gen.finished == 1
    [call] = done.calls
    assert len(done.segments) == 1
    assert out.rlvr_calls == [call.index]  # the one call recorded is the one answered
    assert tok.decode(call.completion_ids, skip_special_tokens=True) == "done"


def _post(url: str, body: dict, **headers: str) -> dict:
    r = httpx.post(f"{url}/chat/completions", content=json.dumps(body), timeout=30,
                   headers={"content-type": "application/json", **headers})
    assert r.status_code == 200, r.text
    return r.json()


def test_a_retry_after_its_try_was_answered_supersedes_that_try(proxy, tok):
    gen = ScriptedGenerator(tok, lambda prompt: "ok")
    sid, url = proxy.open(gen, SamplingParams(max_tokens=16), seed=2)
    body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
    first = _post(url, body, **{"x-stainless-retry-count": "0"})  # answered, but the client had given up
    second = _post(url, body, **{"x-stainless-retry-count": "1"})
    other = _post(url, {**body, "messages": [{"role": "user", "content": "other"}]})
    done = proxy.close(sid)
    assert [c.index for c in done.calls] == second["rlvr_calls"] + other["rlvr_calls"]
    assert first["rlvr_calls"][0] not in {c.index for c in done.calls}
    assert sum(len(s.calls) for s in done.segments) == 2


def test_the_same_request_sent_twice_on_purpose_is_two_calls(proxy, tok):
    gen = ScriptedGenerator(tok, lambda prompt: "ok")
    sid, url = proxy.open(gen, SamplingParams(max_tokens=16), seed=3)
    body = {"model": "policy", "messages": [{"role": "user", "content": "vote"}]}
    answers = [_post(url, body, **{"x-stainless-retry-count": "0"}) for _ in range(2)]
    retry = _post(url, body, **{"x-stainless-retry-count": "1"})  # repeats the latest of the two only
    done = proxy.close(sid)
    assert [c.index for c in done.calls] == answers[0]["rlvr_calls"] + retry["rlvr_calls"]


def test_an_idempotency_key_names_one_request_across_its_tries(proxy, tok):
    gen = ScriptedGenerator(tok, lambda prompt: "ok")
    sid, url = proxy.open(gen, SamplingParams(max_tokens=16), seed=4)
    body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
    _post(url, body, **{"idempotency-key": "k1"})
    _post(url, body, **{"idempotency-key": "k1"})
    last = _post(url, body, **{"idempotency-key": "k1"})
    kept = _post(url, body, **{"idempotency-key": "k2"})
    done = proxy.close(sid)
    assert [c.index for c in done.calls] == last["rlvr_calls"] + kept["rlvr_calls"]


def test_a_retry_that_arrives_while_its_try_still_runs_keeps_that_try_out_of_the_record(proxy, tok):
    gen = SlowAtFirst(tok, lambda prompt: "ok", delays=[1.0])
    sid, url = proxy.open(gen, SamplingParams(max_tokens=16), seed=5)
    body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}

    async def both() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=30) as c:
            headers = {"content-type": "application/json"}
            slow = asyncio.ensure_future(c.post(f"{url}/chat/completions", content=json.dumps(body), headers=headers))
            await asyncio.sleep(0.3)  # the first try is generating
            fast = await c.post(f"{url}/chat/completions", content=json.dumps(body),
                                headers={**headers, "x-stainless-retry-count": "1"})
            return [await slow, fast]

    slow, fast = asyncio.run(both())
    assert slow.status_code == fast.status_code == 200
    done = proxy.close(sid)
    assert [c.index for c in done.calls] == fast.json()["rlvr_calls"]
