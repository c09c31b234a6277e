"""The HTTP sampler: vLLM's response shapes, rlvr's server, and servers that misbehave.

Every failure test asserts the call ended within its bound (``HTTPGenerator.max_call_s``).
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

from rlvr.backends.model.tiny import build_tiny_model  # noqa: E402
from rlvr.backends.sample.http import LOGPROB_FLOOR, HTTPGenerator  # noqa: E402
from rlvr.backends.serve.app import ModelHost, serve_in_thread  # noqa: E402
from rlvr.backends.serve.process import free_port  # noqa: E402
from rlvr.errors import BackendError  # noqa: E402
from rlvr.types import (
    SamplingParams,  # noqa: E402
    StopReason,  # noqa: E402
)

pytestmark = pytest.mark.train
PARAMS = SamplingParams(max_tokens=4, temperature=1.0)
SLACK_S = 0.75  # scheduling slack on a loaded 2-core machine


def vllm_body(ids, logprobs, *, finish="length", token_ids=True, **extra):
    """A completion response shaped like vLLM's (no rlvr fields unless given)."""
    tokens = [f"token_id:{t}" for t in ids]
    choice = {"index": 0, "text": "x" * len(ids), "finish_reason": finish, "stop_reason": None,
              "prompt_logprobs": None,
              "logprobs": {"text_offset": list(range(len(ids))), "token_logprobs": logprobs, "tokens": tokens,
                           "top_logprobs": [{t: lp} for t, lp in zip(tokens, logprobs, strict=True)]}}
    if token_ids:
        choice.update(token_ids=list(ids), prompt_token_ids=[1, 2, 3])
    return {"id": "cmpl-1", "object": "text_completion", "created": 0, "model": "m", "choices": [choice],
            "usage": {"prompt_tokens": 3, "completion_tokens": len(ids), "total_tokens": 3 + len(ids)}, **extra}


OK = (200, vllm_body([7, 8, 9], [-0.5, -1.0, -2.0]))


class ScriptedApp:
    """An ASGI app answering request i with ``script[i]`` (the last entry repeats): a (status, body)
    pair, ``"hang"``, or ``("slow", seconds)`` then OK. Records every request and the peak concurrency."""

    def __init__(self, script):
        self.script, self.requests, self.inflight, self.peak = list(script), [], 0, 0

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        self.requests.append({"path": scope["path"], "headers": dict(scope["headers"]),
                              "json": json.loads(body) if body else None})
        action = self.script[min(len(self.requests), len(self.script)) - 1]
        self.inflight += 1
        self.peak = max(self.peak, self.inflight)
        try:
            if action == "hang":
                await asyncio.sleep(3600)
            if action[0] == "slow":
                await asyncio.sleep(action[1])
                action = OK
            status, payload = action
            await send({"type": "http.response.start", "status": status,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": json.dumps(payload).encode()})
        finally:
            self.inflight -= 1


@pytest.fixture
def scripted():
    """``with scripted(script) as (url, app)``: a scripted server on a free port."""
    from contextlib import contextmanager

    @contextmanager
    def run(script):
        app = ScriptedApp(script)
        with serve_in_thread(app, port=free_port()) as url:
            yield url, app

    return run


def timed(coro):
    start = time.monotonic()
    try:
        return asyncio.run(coro), time.monotonic() - start
    except Exception as exc:  # noqa: BLE001 - returned for the test to inspect
        return exc, time.monotonic() - start


def test_vllm_shape_is_parsed_and_version_is_optional(scripted):
    with scripted([OK]) as (url, app):
        gen = HTTPGenerator(f"{url}/v1", "m")
        out, _ = timed(gen.generate([1, 2, 3], SamplingParams(max_tokens=3, temperature=0.7, stop=("\n",)), seed=11,
                                    session_id="s-1"))
    assert out.ids == (7, 8, 9) and out.logprobs == (-0.5, -1.0, -2.0)
    assert out.stop_reason == StopReason.LENGTH and out.version is None
    request = app.requests[0]
    assert request["path"] == "/v1/completions" and request["headers"][b"x-session-id"] == b"s-1"
    assert request["headers"][b"x-multi-turn-session-id"] == request["headers"][b"x-session-affinity"] == b"s-1"
    body = request["json"]
    assert body["prompt"] == [1, 2, 3] and body["model"] == "m" and body["logprobs"] == 1
    assert body["return_token_ids"] is True and body["seed"] == 11 and body["temperature"] == 0.7
    assert body["max_tokens"] == 3 and body["stop"] == ["\n"] and body["n"] == 1


def test_token_id_strings_fallback_and_version_field(scripted):
    body = vllm_body([4, 5], [-1.0, None], finish="stop", token_ids=False, rlvr_policy_version=3)
    with scripted([(200, body)]) as (url, _app):
        out, _ = timed(HTTPGenerator(url, "m").generate([1], PARAMS, seed=0))
    assert out.ids == (4, 5) and out.logprobs == (-1.0, LOGPROB_FLOOR)
    assert out.stop_reason == StopReason.STOP and out.version == 3


def test_body_without_token_ids_is_a_clear_error(scripted):
    broken = {"choices": [{"index": 0, "text": "hi", "finish_reason": "stop"}]}
    with scripted([(200, broken)]) as (url, app):
        err, _ = timed(HTTPGenerator(url, "m").generate([1, 2], PARAMS, seed=0))
    assert isinstance(err, BackendError) and "return_token_ids" in str(err) and url in str(err)
    assert len(app.requests) == 1


def test_5xx_is_retried_then_succeeds(scripted):
    error = {"error": {"message": "engine busy", "type": "InternalServerError", "param": None, "code": 500}}
    with scripted([(500, error), (503, error), OK]) as (url, app):
        gen = HTTPGenerator(url, "m", retries=3, backoff_s=0.05)
        out, elapsed = timed(gen.generate([1, 2, 3], PARAMS, seed=0))
    assert out.ids == (7, 8, 9) and len(app.requests) == 3 and gen.retried == 2
    assert elapsed <= gen.max_call_s + SLACK_S


def test_5xx_until_retries_run_out(scripted):
    with scripted([(502, {"detail": "bad gateway"})]) as (url, app):
        gen = HTTPGenerator(url, "m", retries=2, backoff_s=0.05)
        err, elapsed = timed(gen.generate([1, 2, 3], PARAMS, seed=0))
    assert isinstance(err, BackendError) and "HTTP 502" in str(err) and "3 attempt(s)" in str(err)
    assert len(app.requests) == 3 and elapsed <= gen.max_call_s + SLACK_S


def test_400_is_not_retried_and_names_the_request(scripted):
    error = {"error": {"message": "This model's maximum context length is 256 tokens", "type": "BadRequestError",
                       "param": "max_tokens", "code": 400}}
    with scripted([(400, error)]) as (url, app):
        gen = HTTPGenerator(url, "policy-v3", retries=3, backoff_s=0.05)
        err, _ = timed(gen.generate([1, 2, 3, 4, 5], PARAMS, seed=0))
    message = str(err)
    assert isinstance(err, BackendError) and len(app.requests) == 1
    for part in (url, "'policy-v3'", "prompt of 5 tokens", "HTTP 400", "maximum context length", "max_tokens"):
        assert part in message, (part, message)


def test_hanging_server_every_call_bounded(scripted):
    with scripted(["hang"]) as (url, _app):
        gen = HTTPGenerator(url, "m", timeout_s=0.4, retries=1, backoff_s=0.05, max_concurrency=4)

        async def one():
            start = time.monotonic()
            try:
                await gen.generate([1, 2, 3], PARAMS, seed=0)
            except BackendError as exc:
                return exc, time.monotonic() - start

        async def many():
            return await asyncio.gather(*(one() for _ in range(4)))

        results, total = timed(many())
    for err, elapsed in results:
        assert "no answer within 0.4s" in str(err) and "prompt of 3 tokens" in str(err)
        assert elapsed <= gen.max_call_s + SLACK_S, elapsed
    assert total <= gen.max_call_s + SLACK_S


def test_concurrency_is_bounded(scripted):
    with scripted([("slow", 0.1)]) as (url, app):
        gen = HTTPGenerator(url, "m", max_concurrency=3)

        async def many():
            return await asyncio.gather(*(gen.generate([1, 2, i], PARAMS, seed=i) for i in range(10)))

        outs, _ = timed(many())
    assert len(outs) == 10 and all(o.ids == (7, 8, 9) for o in outs)
    assert app.peak == 3


class RawServer:
    """A socket server answering connection i with ``script[i]`` (the last repeats): ``"drop"``
    closes the connection unanswered, a dict is sent as a 200 JSON response."""

    def __init__(self, script):
        self.script, self.accepted = script, 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.stopping = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stopping:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            action = self.script[min(self.accepted, len(self.script)) - 1]
            with conn:
                conn.settimeout(2)
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                if action == "drop":
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    continue  # closed with a reset, no response
                payload = json.dumps(action).encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                             b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)

    def close(self):
        self.stopping = True
        self.thread.join(timeout=5)
        self.sock.close()


def test_dropped_connection_is_retried():
    server = RawServer(["drop", OK[1]])
    try:
        gen = HTTPGenerator(server.url, "m", retries=2, backoff_s=0.05)
        out, elapsed = timed(gen.generate([1, 2, 3], PARAMS, seed=0))
    finally:
        server.close()
    assert out.ids == (7, 8, 9) and server.accepted == 2 and elapsed <= gen.max_call_s + SLACK_S


def test_always_dropping_server_fails_bounded():
    server = RawServer(["drop"])
    try:
        gen = HTTPGenerator(server.url, "m", retries=2, backoff_s=0.05)
        err, elapsed = timed(gen.generate([1, 2, 3], PARAMS, seed=0))
    finally:
        server.close()
    assert isinstance(err, BackendError) and server.url in str(err) and "3 attempt(s)" in str(err)
    assert server.accepted >= 3 and elapsed <= gen.max_call_s + SLACK_S


HANGING_SERVER = """
import http.server, sys, time
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        print("got", flush=True)
        time.sleep(600)
s = http.server.HTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"""


def test_server_killed_mid_request():
    proc = subprocess.Popen([sys.executable, "-c", HANGING_SERVER], stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        gen = HTTPGenerator(f"http://127.0.0.1:{port}", "m", timeout_s=10, retries=2, backoff_s=0.05)

        async def scenario():
            call = asyncio.ensure_future(gen.generate([1, 2, 3], PARAMS, seed=0))
            assert (await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 10)).strip() == "got"
            proc.send_signal(signal.SIGKILL)
            start = time.monotonic()
            try:
                await call
            except BackendError as exc:
                return exc, time.monotonic() - start

        (err, after_kill), _ = timed(scenario())
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert f"127.0.0.1:{port}" in str(err) and "3 attempt(s)" in str(err)
    assert after_kill <= 2 * 0.05 + 2 * SLACK_S  # refused connections fail fast; nothing waits for the timeout


def test_unreachable_server_health_and_version():
    gen = HTTPGenerator(f"http://127.0.0.1:{free_port()}", "m", retries=1, backoff_s=0.01, connect_timeout_s=0.5)
    healthy, elapsed = timed(gen.health())
    assert healthy is False and elapsed <= 0.5 + SLACK_S
    err, _ = timed(gen.server_version())
    assert isinstance(err, BackendError) and "/version" in str(err)


@pytest.fixture(scope="module")
def rlvr_url(tmp_path_factory):
    base = build_tiny_model(tmp_path_factory.mktemp("tiny") / "base", hidden=32, layers=2, heads=2, seed=0)
    with serve_in_thread(ModelHost(base, served_model_name="tiny", served_version=5), port=free_port()) as url:
        yield url


def test_against_rlvr_server_across_event_loops(rlvr_url):
    gen = HTTPGenerator(rlvr_url, "tiny", max_concurrency=4)
    for _ in range(2):  # a fresh event loop each time: per-loop clients and semaphores
        outs, _ = timed(_gather(gen, 6))
        assert len(outs) == 6
        for out in outs:
            assert 1 <= len(out.ids) <= 4 and len(out.logprobs) == len(out.ids) and out.version == 5
            assert all(lp <= 0 for lp in out.logprobs)
    info, _ = timed(gen.server_version())
    assert info["served_policy_version"] == 5
    assert timed(gen.health())[0] is True
    err, _ = timed(HTTPGenerator(rlvr_url, "not-loaded").generate([5], PARAMS, seed=0))
    assert isinstance(err, BackendError) and "HTTP 404" in str(err)


async def _gather(gen, n):
    return await asyncio.gather(*(gen.generate([5, 6, 7], PARAMS, seed=s) for s in range(n)))


def test_token_level_sampling_fields_are_sent(scripted):
    params = SamplingParams(max_tokens=3, stop_token_ids=(9, 4), allowed_token_ids=(7, 8, 9))
    with scripted([OK]) as (url, app):
        out, _ = timed(HTTPGenerator(url, "m").generate([1, 2], params, seed=0))
    assert out.ids == (7, 8, 9)
    body = app.requests[0]["json"]
    assert body["stop_token_ids"] == [9, 4] and body["allowed_token_ids"] == [7, 8, 9]
    with scripted([OK]) as (url, app):
        timed(HTTPGenerator(url, "m").generate([1, 2], SamplingParams(max_tokens=3), seed=0))
    assert "stop_token_ids" not in app.requests[0]["json"] and "allowed_token_ids" not in app.requests[0]["json"]


def test_bad_words_ids_are_refused_not_dropped(scripted):
    with scripted([OK]) as (url, app):
        err, _ = timed(HTTPGenerator(url, "m").generate([1], SamplingParams(bad_words_ids=((5, 6),)), seed=0))
    assert isinstance(err, BackendError) and "bad_words_ids" in str(err) and not app.requests


def test_rlvr_server_honours_the_forwarded_token_fields(rlvr_url):
    gen = HTTPGenerator(rlvr_url, "tiny")
    params = SamplingParams(max_tokens=4, temperature=1.0, allowed_token_ids=(11, 12, 13))

    async def four():
        return await asyncio.gather(*(gen.generate([5, 6, 7], params, seed=s) for s in range(4)))

    outs, _ = timed(four())
    assert len(outs) == 4 and all(set(out.ids) <= {11, 12, 13} and len(out.ids) == 4 for out in outs)
