"""``rlvr serve`` under attack and under careless use: a key, allowed folders, bounded requests,
fair batching. Every bad request is a 4xx with a message, the server stays up, and a well-behaved
client is served while a greedy one floods it."""

from __future__ import annotations

import json
import threading
import time

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from rlvr.backends.model.tiny import build_tiny_model  # noqa: E402
from rlvr.backends.serve.app import ModelHost, serve, serve_in_thread  # noqa: E402
from rlvr.backends.serve.model_host import ServerPolicy  # noqa: E402
from rlvr.backends.serve.process import free_port  # noqa: E402
from rlvr.errors import UsageError  # noqa: E402

pytestmark = pytest.mark.train
KEY = "test-key-5b2e"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "base", hidden=32, layers=2, heads=2, seed=0)


@pytest.fixture(scope="module")
def allowed(tmp_path_factory):
    return tmp_path_factory.mktemp("allowed")


@pytest.fixture(scope="module")
def url(base, allowed):
    policy = ServerPolicy(api_key=KEY, allowed_dirs=(str(allowed),), max_body_bytes=2**20, max_samples=64,
                          max_in_flight=32)
    with serve_in_thread(ModelHost(base, served_model_name="tiny", policy=policy, max_batch=32),
                         port=free_port()) as url:
        yield url


def post(url, path, body=None, *, raw=None, headers=AUTH, timeout=60):
    content = raw if raw is not None else json.dumps(body).encode()
    return httpx.post(f"{url}{path}", content=content, headers={**headers, "Content-Type": "application/json"},
                      timeout=timeout)


def refused(response, status) -> str:
    assert response.status_code == status, (response.status_code, response.text[:300])
    message = response.json()["error"]["message"]
    assert message
    return message


def test_every_endpoint_but_health_needs_the_key(url):
    for method, path in [("GET", "/v1/models"), ("GET", "/version"), ("POST", "/v1/completions"),
                         ("POST", "/v1/chat/completions"), ("POST", "/v1/load_lora_adapter"),
                         ("POST", "/v1/unload_lora_adapter"), ("POST", "/rlvr/reload_weights")]:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            response = httpx.request(method, f"{url}{path}", headers=headers, json={}, timeout=10)
            assert "API key" in refused(response, 401), (path, headers)
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    assert httpx.get(f"{url}/v1/models", headers=AUTH, timeout=10).status_code == 200


def test_the_official_client_uses_the_key(url):
    openai = pytest.importorskip("openai")
    good = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY)
    assert good.completions.create(model="tiny", prompt=[9, 10, 80], max_tokens=3, temperature=0).choices
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{url}/v1", api_key="nope").models.list()


def test_binding_beyond_loopback_needs_a_key(base):
    with pytest.raises(UsageError, match=r"--host 0.0.0.0 is reachable beyond this machine: give --api-key"):
        serve(str(base), host="0.0.0.0", port=free_port())


def test_paths_outside_the_allowed_folders_are_refused_alike(url, base, tmp_path):
    outside_real = tmp_path / "adapter"
    outside_real.mkdir()
    (outside_real / "adapter_config.json").write_text("{}")
    answers = set()
    for path in (str(outside_real), str(tmp_path / "missing"), "/etc", "org/some-hub-model"):
        answers.add(refused(post(url, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": path}), 403))
        answers.add(refused(post(url, "/rlvr/reload_weights", {"path": path, "policy_version": 1}), 403)
                    .replace("path is", "lora_path is"))
    assert len(answers) == 1 and "nothing was read" in answers.pop()  # existence is never told


HOSTILE = [
    ("/v1/completions", b"{", 400, "not valid JSON"),
    ("/v1/completions", b"[" * 50_000 + b"]" * 50_000, 400, "nested too deeply"),
    ("/v1/completions", b"x" * (2**20 + 10), 413, "over"),
    ("/v1/completions", b'{"prompt": [9, 10], "temperature": Infinity}', 400, "temperature"),
    ("/v1/completions", b'{"prompt": [9, 10], "temperature": NaN}', 400, "temperature"),
    ("/v1/completions", {"prompt": [9, 10], "temperature": -1}, 400, "temperature"),
    ("/v1/completions", {"prompt": [9, 10], "stop": ""}, 400, "stop strings must be non-empty"),
    ("/v1/completions", {"prompt": [9, 10], "stop": ["a"] * 100}, 400, "stop"),
    ("/v1/completions", {"prompt": [9, 10], "n": 0}, 400, "n"),
    ("/v1/completions", {"prompt": [9, 10], "n": 1000}, 400, "n"),
    ("/v1/completions", {"prompt": [[9, 10]] * 10, "n": 10}, 400, "at most 64 per request"),
    ("/v1/completions", {"prompt": [9, 10], "max_tokens": 10**9}, 400, "maximum context length"),
    ("/v1/completions", {"prompt": [10**9]}, 400, "outside"),
    ("/v1/completions", {"prompt": 5}, 400, "prompt"),
    ("/v1/completions", {"prompt": [9, 10], "model": "nope"}, 404, "does not exist"),
    ("/v1/completions", [1, 2], 400, "JSON object"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, 400,
     "must be a string"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
]


@pytest.mark.parametrize(("path", "body", "status", "says"), HOSTILE, ids=[str(i) for i in range(len(HOSTILE))])
def test_hostile_requests_are_4xx_with_a_message_and_the_server_stays_up(url, path, body, status, says):
    raw = body if isinstance(body, bytes) else None
    message = refused(post(url, path, None if raw else body, raw=raw), status)
    assert says in message, message
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200


def test_a_tiny_temperature_is_greedy_not_a_500(url):
    tiny = post(url, "/v1/completions", {"prompt": [9, 10, 80], "max_tokens": 4, "temperature": 1e-300})
    greedy = post(url, "/v1/completions", {"prompt": [9, 10, 80], "max_tokens": 4, "temperature": 0})
    assert tiny.status_code == greedy.status_code == 200
    assert tiny.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"]


def test_reloading_a_file_that_is_not_safetensors_is_a_400(url, allowed):
    (allowed / "junk.safetensors").write_bytes(b"not weights at all")
    message = refused(post(url, "/rlvr/reload_weights", {"path": str(allowed / "junk.safetensors"),
                                                         "policy_version": 3}), 400)
    assert "is not a safetensors weights file" in message


def test_a_failed_in_place_reload_keeps_the_old_adapter(url, base, allowed):
    from rlvr.backends.model.policy import LoraSpec, Policy

    good = allowed / "good"
    Policy(str(base), lora=LoraSpec(rank=4), need_reference=False, seed=1).model.save_pretrained(good)
    assert post(url, "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": str(good)}).status_code == 200
    ask = {"prompt": [9, 10, 80], "max_tokens": 4, "temperature": 0, "model": "a"}
    before = post(url, "/v1/completions", ask).json()["choices"][0]["text"]
    broken = allowed / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text((good / "adapter_config.json").read_text())
    (broken / "adapter_model.safetensors").write_bytes(b"torn file")
    refused(post(url, "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": str(broken), "load_inplace": True}),
            400)
    models = [m["id"] for m in httpx.get(f"{url}/v1/models", headers=AUTH, timeout=10).json()["data"]]
    assert "a" in models and post(url, "/v1/completions", ask).json()["choices"][0]["text"] == before


json_values = st.recursive(st.none() | st.booleans() | st.integers(-10**12, 10**12) | st.floats(allow_nan=False)
                           | st.text(max_size=8), lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=12)
fields = st.fixed_dictionaries({}, optional={
    "prompt": json_values | st.lists(st.integers(-5, 200), min_size=1, max_size=8),
    "messages": json_values, "n": json_values | st.integers(-2, 80), "max_tokens": json_values | st.integers(-2, 300),
    "temperature": json_values, "top_p": json_values, "stop": json_values, "seed": json_values,
    "logprobs": json_values, "model": json_values, "stream": json_values, "top_k": json_values,
})


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=fields, chat=st.booleans())
def test_fuzzed_bodies_never_get_a_5xx(url, body, chat):
    response = post(url, "/v1/chat/completions" if chat else "/v1/completions", body)
    assert response.status_code < 500, (body, response.text[:300])
    if response.status_code >= 400:
        assert response.json()["error"]["message"]


def test_a_well_behaved_client_is_served_while_a_greedy_one_floods(url):
    greedy_done: list[float] = []
    errors: list[int] = []

    def greedy() -> None:
        r = post(url, "/v1/completions", {"prompt": [[9, 10, 80]], "n": 64, "max_tokens": 8}, timeout=300)
        (greedy_done if r.status_code == 200 else errors).append(time.monotonic() if r.status_code == 200
                                                                else r.status_code)

    flood = [threading.Thread(target=greedy) for _ in range(12)]
    for t in flood:
        t.start()
    time.sleep(0.3)  # the flood is queued
    polite = post(url, "/v1/completions", {"prompt": [9, 10], "max_tokens": 4}, timeout=300)
    served_at = time.monotonic()
    for t in flood:
        t.join()
    assert polite.status_code == 200 and errors == []
    # Batches take turns between requests: the one-sample request did not wait behind the backlog.
    assert sum(done > served_at for done in greedy_done) >= 6, (len(greedy_done), served_at, greedy_done)
