"""``rlvr serve``'s limits: chat templates rendered off the event loop under length, memory and time
bounds; the in-flight slot taken once a body has arrived, within a timeout; ``/health`` never
refused; loopback decided by resolving the host; start-up limits checked; malformed strings a 400
naming their field; the API key kept out of ``ps``. And all the attacks at once: a well-behaved
client is answered beside them (its latency is measured by ``bench/serve_under_attack.py``)."""

from __future__ import annotations

import argparse
import json
import select
import socket
import threading
import time

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from rlvr.backends.model.tiny import build_tiny_model  # noqa: E402
from rlvr.backends.serve.app import ModelHost, is_loopback, serve, serve_in_thread  # noqa: E402
from rlvr.backends.serve.model_host import ServerPolicy  # noqa: E402
from rlvr.backends.serve.process import free_port  # noqa: E402
from rlvr.backends.serve.render import RenderLimits  # noqa: E402
from rlvr.backends.serve.requests import check_strings  # noqa: E402
from rlvr.cli.commands import parser, serve_api_key  # noqa: E402
from rlvr.errors import RequestError, UsageError  # noqa: E402

pytestmark = pytest.mark.train
BOMB = "{{ 'a' * 200000000 }}"
SMALL = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "base", hidden=32, layers=2, heads=2, seed=0)


@pytest.fixture(scope="module")
def served(base):
    policy = ServerPolicy(max_body_bytes=16 * 2**20, max_in_flight=8, body_timeout_s=3.0, max_samples=256,
                          render=RenderLimits(workers=2, timeout_s=3.0, memory_mb=512, max_template_chars=4096,
                                              max_prompt_chars=2**20))
    host = ModelHost(base, served_model_name="tiny", policy=policy, max_batch=256)
    with serve_in_thread(host, port=free_port()) as url:
        warm = [threading.Thread(target=httpx.post, args=(f"{url}/v1/chat/completions",),
                                 kwargs={"json": SMALL, "timeout": 120}) for _ in range(2)]
        for t in warm:  # both render workers have started
            t.start()
        for t in warm:
            t.join()
        yield host, url


def refused(response, status: int, *says: str) -> None:
    assert response.status_code == status, (response.status_code, response.text[:300])
    message = response.json()["error"]["message"]
    assert all(s in message for s in says), message


# ---- rendering ------------------------------------------------------------------------------------
def test_a_template_bomb_is_refused_naming_a_limit_and_the_next_request_is_served(served):
    _, url = served
    r = httpx.post(f"{url}/v1/chat/completions", json={**SMALL, "chat_template": BOMB}, timeout=60)
    assert r.status_code == 413, r.text
    assert any(flag in r.json()["error"]["message"] for flag in ("--max-prompt-chars", "--render-memory-mb",
                                                                 "--render-timeout-s"))
    assert httpx.post(f"{url}/v1/chat/completions", json=SMALL, timeout=60).status_code == 200


def test_a_template_that_never_ends_is_stopped_at_the_time_limit(served):
    _, url = served
    loop = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    start = time.monotonic()
    refused(httpx.post(f"{url}/v1/chat/completions", json={**SMALL, "chat_template": loop}, timeout=60), 413,
            "--render-timeout-s")
    assert time.monotonic() - start < 10


def test_long_templates_and_prompts_are_refused_before_rendering(served):
    _, url = served
    refused(httpx.post(f"{url}/v1/chat/completions", json={**SMALL, "chat_template": "x" * 5000}, timeout=30), 413,
            "--max-template-chars")
    big = {"role": "user", "content": "x" * (2**20 + 1)}
    refused(httpx.post(f"{url}/v1/chat/completions", json={**SMALL, "messages": [big]}, timeout=30), 413,
            "--max-prompt-chars")
    refused(httpx.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": "x" * (2**20 + 1)}, timeout=30),
            413, "--max-prompt-chars")


# ---- bodies and slots ----------------------------------------------------------------------------
def slow_client(url: str, results: list, trickle_s: float = 0.5, for_s: float = 30.0) -> socket.socket:
    """A client that declares a body and sends it one byte at a time (slowloris)."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    body = json.dumps({"model": "tiny", "prompt": [9, 10], "max_tokens": 2}).encode()
    sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n".encode())

    def trickle() -> None:
        end = time.monotonic() + for_s
        try:
            for byte in body:
                sock.sendall(bytes([byte]))
                answered, _, _ = select.select([sock], [], [], trickle_s)  # the server may answer meanwhile
                if answered or time.monotonic() > end:
                    break
            sock.settimeout(5)
            results.append(sock.recv(4096).split(b"\r\n")[0])
        except OSError:
            results.append(b"closed")

    threading.Thread(target=trickle, daemon=True).start()
    return sock


def test_slow_bodies_hold_no_slot_and_meet_the_body_timeout(served):
    _, url = served
    results: list = []
    socks = [slow_client(url, results) for _ in range(12)]  # more than max_in_flight = 8
    time.sleep(0.5)
    assert httpx.get(f"{url}/health", timeout=5).status_code == 200
    ok = httpx.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": [9, 10], "max_tokens": 2}, timeout=30)
    assert ok.status_code == 200, ok.text
    deadline = time.monotonic() + 20
    while len(results) < len(socks) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert results and all(b"408" in r for r in results), results
    for sock in socks:
        sock.close()


def test_malformed_strings_are_a_400_naming_the_field(served):
    _, url = served
    cases = [
        (b'{"model": "tiny", "prompt": "a\\u0000b"}', "/v1/completions", "prompt"),
        (b'{"model": "tiny", "prompt": "\\ud800"}', "/v1/completions", "prompt"),
        (b'{"model": "\\udfff", "prompt": [1, 2]}', "/v1/completions", "model"),
        (b'{"model": "tiny", "prompt": [1, 2], "stop": ["\\ud800"]}', "/v1/completions", "stop"),
        (b'{"model": "tiny", "messages": [{"role": "user", "content": "\\ud83d"}]}', "/v1/chat/completions",
         "messages"),
        (b'{"model": "tiny", "messages": [{"role": "user\\u0000", "content": "a"}]}', "/v1/chat/completions",
         "messages"),
        (b'{"lora_name": "a", "lora_path": "/tmp/a\\u0000b"}', "/v1/load_lora_adapter", "lora_path"),
        (json.dumps({"lora_name": "a" * 5000, "lora_path": "/tmp/x"}).encode(), "/v1/load_lora_adapter", "lora_name"),
        (json.dumps({"lora_name": "a", "lora_path": "/" + "a" * 10000}).encode(), "/v1/load_lora_adapter", "lora_path"),
        (json.dumps({"path": "/" + "a" * 10000, "policy_version": 1}).encode(), "/rlvr/reload_weights", "path"),
        (json.dumps({"model": "m" * 5000, "prompt": [1]}).encode(), "/v1/completions", "model"),
        (b'{"\\ud800": 1, "prompt": [1]}', "/v1/completions", None),
    ]
    for raw, path, field in cases:
        r = httpx.post(f"{url}{path}", content=raw, headers={"Content-Type": "application/json"}, timeout=30)
        assert r.status_code == 400, (raw[:80], r.status_code, r.text[:200])
        error = r.json()["error"]
        if field is not None:
            assert error["param"] == field, (raw[:80], error)


def test_check_strings_names_the_path_of_the_bad_string():
    with pytest.raises(RequestError, match=r"messages\[1\]\.content contains a NUL byte") as caught:
        check_strings({"messages": [{"content": "ok"}, {"content": "a\0"}]})
    assert caught.value.param == "messages"
    with pytest.raises(RequestError, match="lone surrogate"):
        check_strings({"tools": [{"function": {"name": "\udc80"}}]})
    check_strings({"prompt": "plain text, émoji 🙂", "n": 1})


# ---- start-up -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("host", "loopback"), [("127.0.0.1", True), ("::1", True), ("localhost", True),
                                                 ("localhost.attacker.example", False), ("0.0.0.0", False),
                                                 ("127.0.0.1.nip.io.invalid", False), ("", False)])
def test_loopback_is_decided_by_the_resolved_addresses(host, loopback):
    assert is_loopback(host) is loopback


def test_a_host_named_like_localhost_needs_a_key(base):
    with pytest.raises(UsageError, match="reachable beyond this machine"):
        serve(str(base), host="localhost.attacker.example", port=free_port())


@pytest.mark.parametrize(("argv", "flag"), [(["--max-in-flight", "0"], "--max-in-flight"),
                                            (["--max-body-mb", "-1"], "--max-body-mb"),
                                            (["--max-samples", "0"], "--max-samples"),
                                            (["--body-timeout-s", "nan"], "--body-timeout-s"),
                                            (["--render-workers", "0"], "--render-workers")])
def test_start_up_limits_are_checked_naming_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit):
        parser().parse_args(["serve", "model", *argv])
    assert flag in capsys.readouterr().err


@pytest.mark.parametrize(("field", "flag"), [("max_in_flight", "--max-in-flight"), ("max_body_bytes", "--max-body-mb"),
                                             ("body_timeout_s", "--body-timeout-s")])
def test_the_policy_refuses_limits_below_one(field, flag):
    with pytest.raises(UsageError, match=flag):
        ServerPolicy(**{field: 0})
    with pytest.raises(UsageError, match="--render-timeout-s"):
        ServerPolicy(render=RenderLimits(timeout_s=-1))


def test_the_api_key_is_read_from_a_file_or_the_environment_and_warned_about_on_the_command_line(
        tmp_path, monkeypatch, capsys):
    key_file = tmp_path / "key"
    key_file.write_text("from-file-123\n")
    args = argparse.Namespace(api_key=None, api_key_file=str(key_file))
    assert serve_api_key(args) == "from-file-123"
    monkeypatch.setenv("RLVR_API_KEY", "from-env-456")
    assert serve_api_key(argparse.Namespace(api_key=None, api_key_file=None)) == "from-env-456"
    assert capsys.readouterr().err == ""
    assert serve_api_key(argparse.Namespace(api_key="given", api_key_file=None)) == "given"
    assert "shows in `ps`" in capsys.readouterr().err
    with pytest.raises(UsageError, match="not both"):
        serve_api_key(argparse.Namespace(api_key="given", api_key_file=str(key_file)))
    with pytest.raises(UsageError, match="cannot read"):
        serve_api_key(argparse.Namespace(api_key=None, api_key_file=str(tmp_path / "missing")))


# ---- everything at once ----------------------------------------------------------------------------
@pytest.mark.slow
def test_under_every_attack_at_once_a_small_request_and_health_are_answered_while_the_big_one_runs(served):
    """A template bomb, an 8 MB prompt, slow connections (more than the in-flight slots; 70 in the
    field, 20 here for CI time) and an n=256, max_tokens=200 request, all at once: a small request
    and ``/health`` are answered while the big request is still generating (not after it, as a
    first-come server answers them). How long they wait is a benchmark, not a test:
    ``bench/serve_under_attack.py`` (goals: under 2 s and 1 s)."""
    host, url = served
    outcomes: dict[str, object] = {}

    def attack(name: str, path: str, body: dict, timeout: float = 300) -> None:
        try:
            outcomes[name] = httpx.post(f"{url}{path}", json=body, timeout=timeout).status_code
        except httpx.HTTPError as exc:
            outcomes[name] = type(exc).__name__

    slow: list = []
    socks = [slow_client(url, slow, trickle_s=1.0) for _ in range(20)]
    before = host.engine.batches
    attacks = [threading.Thread(target=attack, args=a) for a in [
        ("big", "/v1/completions", {"model": "tiny", "prompt": [9, 10, 80], "n": 256, "max_tokens": 200,
                                    "allowed_token_ids": list(range(10, 90))}),
        ("bomb", "/v1/chat/completions", {**SMALL, "chat_template": BOMB}),
        ("8mb", "/v1/completions", {"model": "tiny", "prompt": "x " * (4 * 2**20)}),
    ]]
    for t in attacks:
        t.start()
    while host.engine.batches == before:  # the big request is generating
        time.sleep(0.01)
    time.sleep(0.3)  # and the bomb is rendering
    health_s, small_s = [], []
    for _ in range(3):
        start = time.monotonic()
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        health_s.append(time.monotonic() - start)
        start = time.monotonic()
        r = httpx.post(f"{url}/v1/chat/completions", json=SMALL, timeout=30)
        small_s.append(time.monotonic() - start)
        assert r.status_code == 200, r.text
        assert "big" not in outcomes, (outcomes, health_s, small_s)  # answered beside the big request
    print(f"under attack: /health {max(health_s):.2f} s, small request {max(small_s):.2f} s at most")
    for t in attacks:
        t.join(timeout=300)
    assert outcomes == {"big": 200, "bomb": 413, "8mb": 413}, outcomes
    for sock in socks:
        sock.close()
