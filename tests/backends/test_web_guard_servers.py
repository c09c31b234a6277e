"""Web pages against ``rlvr serve`` and ``rlvr proxy``: a cross-origin ``text/plain`` POST, a
same-origin one and a request under a foreign Host (DNS rebinding) reach no handler (the model host
and the generator see no call) and get a 4xx naming the header; an allowed origin is served, CORS
included. ``rlvr proxy`` renders chat templates in bounded worker processes: a looping template is
refused at its time limit while other requests are served, and SIGTERM stops the command even with
such a render in flight. The rules themselves and ``rlvr rollout-worker``'s attacks:
test_web_guard.py."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from rlvr.backends.model.tiny import build_tokenizer  # noqa: E402
from rlvr.backends.proxy.app import AgentProxy  # noqa: E402
from rlvr.backends.serve.app import create_app, serve_in_thread  # noqa: E402
from rlvr.backends.serve.model_host import ServerPolicy  # noqa: E402
from rlvr.backends.serve.process import free_port  # noqa: E402
from rlvr.backends.serve.render import RenderLimits  # noqa: E402
from rlvr.errors import UsageError  # noqa: E402
from rlvr.types import Completion, StopReason  # noqa: E402

pytestmark = pytest.mark.train
PAGE = "http://evil.example"
FRIEND = "http://localhost:3000"
JSON = {"content-type": "application/json"}
LOOP = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
CHAT = {"model": "policy", "messages": [{"role": "user", "content": "1+2="}], "max_tokens": 4}


def post(url: str, path: str, body: dict, timeout: float = 60, **headers: str) -> httpx.Response:
    return httpx.post(f"{url}{path}", content=json.dumps(body), headers=headers, timeout=timeout)


def refused(response: httpx.Response, status: int, header: str) -> None:
    assert response.status_code == status, (response.status_code, response.text[:300])
    error = response.json()["error"]
    assert error["param"] == header and error["message"], error


def attacks(url: str, path: str, body: dict) -> None:
    """The three ways in a web page has, each refused naming its header."""
    port = url.rsplit(":", 1)[1]
    refused(post(url, path, body, **{"content-type": "text/plain", "origin": PAGE}), 403, "Origin")
    refused(post(url, path, body, **{"content-type": "text/plain"}), 415, "Content-Type")
    refused(post(url, path, body, host=f"evil.example:{port}", **JSON), 403, "Host")


# ---- rlvr serve ------------------------------------------------------------------------------------------
class RecordingHost:
    """What ``rlvr serve``'s app calls on its model host, recording each call (no model)."""

    def __init__(self, policy: ServerPolicy):
        self.policy, self.calls, self.base_version = policy, [], 0

    async def load_adapter(self, name: str, path: str, version: int | None, replace: bool = False) -> None:
        self.calls.append(("load_adapter", name, path))

    async def reload_weights(self, path: str, version: int | None) -> int:
        self.calls.append(("reload_weights", path))
        return 0

    def close(self) -> None:
        pass


def test_serve_answers_no_web_page_and_an_allowed_origin_with_cors(tmp_path):
    host = RecordingHost(ServerPolicy(allowed_dirs=(str(tmp_path),), allowed_origins=(FRIEND,)))
    with serve_in_thread(create_app(host), port=free_port()) as url:
        for path, body in [("/v1/load_lora_adapter", {"lora_name": "a", "lora_path": str(tmp_path)}),
                           ("/rlvr/reload_weights", {"path": str(tmp_path), "policy_version": 9})]:
            attacks(url, path, body)
        assert host.calls == []
        answer = post(url, "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": str(tmp_path)}, origin=FRIEND,
                      **JSON)
        assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == FRIEND
        assert host.calls == [("load_adapter", "a", str(tmp_path))]
        assert httpx.get(f"{url}/health", headers={"host": "evil.example"}).status_code == 200  # a probe


def test_serve_refuses_a_malformed_allowed_origin_naming_the_flag():
    with pytest.raises(UsageError, match="rlvr serve --allowed-origin 'localhost:3000'"):
        ServerPolicy(allowed_origins=("localhost:3000",))


# ---- rlvr proxy ------------------------------------------------------------------------------------------
class RecordingGenerator:
    """Answers every call with the end of text, recording it."""

    def __init__(self, eos: int):
        self.eos, self.calls = eos, []

    async def generate(self, prompt_ids, params, *, seed):
        self.calls.append(tuple(prompt_ids))
        return Completion((self.eos,), (-0.5,), StopReason.STOP, 0)


@pytest.fixture(scope="module")
def proxy():
    tok = build_tokenizer()
    gen = RecordingGenerator(tok.eos_token_id)
    p = AgentProxy(tok, default=gen, render=RenderLimits(workers=1, timeout_s=3.0, command="rlvr proxy"),
                   allowed_origins=(FRIEND,))
    p.start()
    yield p, gen
    p.stop()


def test_the_proxy_answers_no_web_page_and_an_allowed_origin_with_cors(proxy):
    p, gen = proxy
    for path, body in [("/s/web/v1/chat/completions", CHAT), ("/s/web/v1/completions", {"prompt": "1+2="}),
                       ("/s/web/v1/messages", {"model": "m", "max_tokens": 4, "messages": CHAT["messages"]})]:
        attacks(p.url, path, body)
    refused(post(p.url, "/sessions/web/close", {}, **{"content-type": "text/plain", "origin": PAGE}), 403, "Origin")
    assert gen.calls == [] and "web" not in p.book.ids()
    answer = post(p.url, "/s/friend/v1/chat/completions", CHAT, origin=FRIEND, **JSON)
    assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == FRIEND
    assert len(gen.calls) == 1


def test_a_looping_template_ends_at_the_proxys_render_limit_and_others_are_served(proxy):
    p, gen = proxy
    start = time.monotonic()
    answer = post(p.url, "/s/loop/v1/chat/completions", {**CHAT, "chat_template": LOOP}, **JSON)
    assert answer.status_code == 413 and "rlvr proxy --render-timeout-s" in answer.json()["error"]["message"]
    assert time.monotonic() - start < 30
    assert post(p.url, "/s/after/v1/chat/completions", CHAT, **JSON).status_code == 200


def test_sigterm_stops_rlvr_proxy_with_a_looping_render_in_flight(tmp_path):
    build_tokenizer().save_pretrained(tmp_path / "tok")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "rlvr.cli", "proxy", str(tmp_path / "tok"), "--url",
                             "http://127.0.0.1:9", "--port", str(port), "--render-timeout-s", "300",
                             "--render-workers", "1", "--record", str(tmp_path / "sessions.jsonl")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 120
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0][-2000:]
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)

        # A first request waits for the render worker to start (its sampling then fails: no server at --url).
        assert post(url, "/s/warm/v1/chat/completions", CHAT, **JSON).status_code >= 400

        def looping_client() -> None:  # leaves after 2 s; its render would run for minutes
            try:
                post(url, "/s/x/v1/chat/completions", {**CHAT, "chat_template": LOOP}, timeout=2, **JSON)
            except httpx.HTTPError:
                pass

        client = threading.Thread(target=looping_client)
        client.start()
        client.join()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)  # before the render's own 300 s limit
        assert proc.returncode == 0, out[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
