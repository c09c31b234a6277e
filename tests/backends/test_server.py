"""rlvr's OpenAI-compatible server: every endpoint, through the official openai client and raw httpx."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

import torch  # noqa: E402

import rlvr  # noqa: E402
from rlvr.backends.model.io import (  # noqa: E402
    load_model,
    load_tokenizer,
    render_prompt_ids,
    token_logprobs,
)
from rlvr.backends.model.policy import LoraSpec, Policy  # noqa: E402
from rlvr.backends.model.tiny import build_tiny_model  # noqa: E402
from rlvr.backends.sample.batched import sample_batch  # noqa: E402
from rlvr.backends.serve.app import ModelHost, serve_in_thread  # noqa: E402
from rlvr.backends.serve.model_host import ServerPolicy  # noqa: E402
from rlvr.backends.serve.process import ServerProcess, free_port  # noqa: E402
from rlvr.backends.serve.render import START_TIMEOUT_S  # noqa: E402
from rlvr.backends.sync.lanes import write_policy_version  # noqa: E402
from rlvr.errors import BackendError  # noqa: E402
from rlvr.types import SamplingParams  # noqa: E402

pytestmark = pytest.mark.train
NAME = "tiny"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "base", hidden=32, layers=2, heads=2, seed=0)


@pytest.fixture(scope="module")
def host(base, tmp_path_factory):
    # Adapters and weights may come from the tests' temporary folders only.
    return ModelHost(base, served_model_name=NAME, policy=ServerPolicy(
        allowed_dirs=(str(tmp_path_factory.getbasetemp()),)))


@pytest.fixture(scope="module")
def url(host):
    with serve_in_thread(host, port=free_port()) as url:
        yield url


@pytest.fixture(scope="module")
def client(url):
    # The first chat request waits for a render worker to load (up to START_TIMEOUT_S on a busy machine).
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=START_TIMEOUT_S + 30)


@pytest.fixture(scope="module")
def tokenizer(base):
    return load_tokenizer(str(base))


def make_adapter(base, folder, *, seed: int, version: int):
    """A LoRA adapter whose B matrices are random, so it visibly changes the outputs."""
    policy = Policy(str(base), lora=LoraSpec(rank=4), need_reference=False, seed=seed)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for name, w in policy.model.named_parameters():
            if "lora_B" in name:
                w.normal_(std=0.5)
    policy.model.save_pretrained(str(folder))
    write_policy_version(folder, version)
    return policy


def greedy_ids(model, prompt, max_tokens, eos_ids, pad_id):
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    return list(sample_batch(model, [prompt], params, seed=0, eos_ids=eos_ids, pad_id=pad_id)[0].ids)


def test_health_version_and_models(url, client):
    assert httpx.get(f"{url}/health").status_code == 200
    info = httpx.get(f"{url}/version").json()
    assert info["version"] == rlvr.__version__
    assert info["served_policy_version"] == 0 and info["adapters"] == {}
    models = client.models.list()
    assert [m.id for m in models.data] == [NAME]
    assert models.data[0].model_dump()["max_model_len"] == 256


def test_completion_token_ids_round_trip(client, tokenizer):
    prompt = tokenizer("37+45=")["input_ids"]
    r = client.completions.create(model=NAME, prompt=prompt, max_tokens=6, n=3, seed=5, logprobs=1,
                                  extra_body={"return_token_ids": True})
    assert len(r.choices) == 3 and r.model == NAME
    dump = r.model_dump()
    assert dump["rlvr_policy_version"] == 0
    for choice in dump["choices"]:
        assert choice["prompt_token_ids"] == prompt
        ids = choice["token_ids"]
        assert 1 <= len(ids) <= 6 and len(choice["logprobs"]["token_logprobs"]) == len(ids)
        assert choice["text"] == tokenizer.decode(ids, skip_special_tokens=True)
        assert choice["finish_reason"] in ("stop", "length")
    assert r.usage.prompt_tokens == 3 * len(prompt)
    # A text prompt is tokenized by the server the same way.
    text = client.completions.create(model=NAME, prompt="37+45=", max_tokens=2, extra_body={"return_token_ids": True})
    assert text.model_dump()["choices"][0]["prompt_token_ids"] == prompt
    # Batched prompts: n choices per prompt, in order.
    two = client.completions.create(model=NAME, prompt=[prompt, prompt[:3]], max_tokens=2, n=2,
                                    extra_body={"return_token_ids": True})
    assert [c["prompt_token_ids"] for c in two.model_dump()["choices"]] == [prompt, prompt, prompt[:3], prompt[:3]]


def test_tokens_as_token_ids(url, tokenizer):
    body = {"model": NAME, "prompt": [5, 6, 7], "max_tokens": 3, "logprobs": 0, "return_token_ids": True,
            "return_tokens_as_token_ids": True}
    choice = httpx.post(f"{url}/v1/completions", json=body).json()["choices"][0]
    assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in choice["token_ids"]]


@pytest.mark.parametrize("temperature", [0.7, 1.0, 0.0])
def test_logprobs_match_token_logprobs(client, base, tokenizer, temperature):
    prompt = tokenizer("12+34=")["input_ids"]
    r = client.completions.create(model=NAME, prompt=prompt, max_tokens=8, n=4, seed=1, logprobs=1,
                                  temperature=temperature, extra_body={"return_token_ids": True})
    model = load_model(str(base))
    for choice in r.model_dump()["choices"]:
        ids = choice["token_ids"]
        full = torch.tensor([prompt + ids])
        with torch.no_grad():
            ref = token_logprobs(model, full, torch.ones_like(full), temperature=temperature)[0, len(prompt) - 1:]
        got = torch.tensor(choice["logprobs"]["token_logprobs"])
        assert torch.allclose(got, ref, atol=1e-4), (got, ref)


def test_chat_completion(client, tokenizer):
    messages = [{"role": "user", "content": "7+8="}]
    r = client.chat.completions.create(model=NAME, messages=messages, max_tokens=4, logprobs=True, seed=2,
                                       extra_body={"return_token_ids": True})
    dump = r.model_dump()
    assert dump["prompt_token_ids"] == render_prompt_ids(tokenizer, messages)
    choice = dump["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == tokenizer.decode(choice["token_ids"], skip_special_tokens=True)
    assert len(choice["logprobs"]["content"]) == len(choice["token_ids"])
    assert dump["rlvr_policy_version"] == 0


def test_stop_string_cuts_text_and_ids(client, tokenizer):
    prompt = tokenizer("1+1=")["input_ids"]
    first = client.completions.create(model=NAME, prompt=prompt, max_tokens=12, temperature=0,
                                      extra_body={"return_token_ids": True}).model_dump()["choices"][0]
    text, ids = first["text"], first["token_ids"]
    stop = next(ch for ch in text[2:] if ch.strip())  # a visible character, not the first one
    at = text.index(stop)
    cut = client.completions.create(model=NAME, prompt=prompt, max_tokens=12, temperature=0, stop=[stop],
                                    extra_body={"return_token_ids": True}).model_dump()["choices"][0]
    assert cut["text"] == text[:at] and cut["finish_reason"] == "stop" and cut["stop_reason"] == stop
    assert cut["token_ids"] == ids[:at + 1]  # the character tokenizer: one token per character


@pytest.mark.parametrize("body, param", [
    ({"prompt": [1, 2], "temperature": -1}, "temperature"),
    ({"prompt": [1, 2], "n": 0}, "n"),
    ({"prompt": [1, 2], "top_p": 0}, "top_p"),
    ({"prompt": [1, 99999]}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [1, 2], "response_format": {"type": "json_object"}}, "response_format"),
    ({"prompt": [1, 2], "logprobs": 21}, "logprobs"),
    ({"prompt": [1, 2], "max_tokens": 10_000}, "max_tokens"),
    ({"prompt": [1, 2], "presence_penalty": 0.5}, "presence_penalty"),
    ({}, "prompt"),
])
def test_bad_completion_requests_name_the_field(url, body, param):
    r = httpx.post(f"{url}/v1/completions", json={"model": NAME, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["code"] == 400 and error["type"] == "BadRequestError"


def test_bad_requests_other_shapes(url, client):
    r = httpx.post(f"{url}/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    r = httpx.post(f"{url}/v1/completions", json={"model": "nope", "prompt": [1]})
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    r = httpx.post(f"{url}/v1/chat/completions", json={"model": NAME, "messages": [{"role": "robot", "content": "x"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model=NAME, prompt=[1, 2], temperature=-2)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt=[1, 2])


def test_lora_load_unload_and_versions(url, client, base, tokenizer, tmp_path, host):
    policy = make_adapter(base, tmp_path / "a7", seed=1, version=7)
    make_adapter(base, tmp_path / "a9", seed=2, version=9)
    prompt = tokenizer("5+5=")["input_ids"]
    load = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "a7", "lora_path": str(tmp_path / "a7")})
    assert load.status_code == 200 and "a7" in load.text
    assert httpx.post(f"{url}/v1/load_lora_adapter",
                      json={"lora_name": "a9", "lora_path": str(tmp_path / "a9")}).status_code == 200
    again = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "a7", "lora_path": str(tmp_path / "a7")})
    assert again.status_code == 400 and again.json()["error"]["param"] == "lora_name"
    missing = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": str(tmp_path / "none")})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "lora_path"
    assert [m.id for m in client.models.list().data] == [NAME, "a7", "a9"]
    info = httpx.get(f"{url}/version").json()
    assert info["adapters"] == {"a7": 7, "a9": 9} and info["served_policy_version"] == 9

    def greedy(model):
        r = client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0,
                                      extra_body={"return_token_ids": True}).model_dump()
        return r["choices"][0]["token_ids"], r["rlvr_policy_version"]

    # Concurrent requests for three models: each batch runs with its own adapter.
    results: dict[str, tuple] = {}
    threads = [threading.Thread(target=lambda m=m: results.__setitem__(m, greedy(m))) for m in (NAME, "a7", "a9")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    eos, pad = policy.eos_ids, tokenizer.pad_token_id
    assert results["a7"] == (greedy_ids(policy.model, prompt, 8, eos, pad), 7)
    with policy.model.disable_adapter():
        assert results[NAME] == (greedy_ids(policy.model, prompt, 8, eos, pad), 0)
    assert results["a9"][1] == 9 and results["a9"][0] != results["a7"][0]

    assert httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "a7"}).status_code == 200
    assert httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "a9"}).status_code == 200
    gone = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "a7"})
    assert gone.status_code == 404 and gone.json()["error"]["param"] == "lora_name"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="a7", prompt=prompt, max_tokens=2)
    assert greedy(NAME) == results[NAME]  # the base is back, adapters fully out
    assert httpx.get(f"{url}/version").json()["adapters"] == {}


def test_reload_weights_endpoint(url, base, tmp_path, tokenizer, host):
    from safetensors.torch import save_file

    model = load_model(str(base))
    with torch.no_grad():
        for w in model.parameters():
            w.mul_(1.5)
    save_file({n: p.detach().contiguous() for n, p in model.named_parameters()}, str(tmp_path / "model.safetensors"))
    bad = httpx.post(f"{url}/rlvr/reload_weights", json={"path": str(tmp_path / "missing"), "policy_version": 3})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "path"
    no_version = httpx.post(f"{url}/rlvr/reload_weights", json={"path": str(tmp_path)})
    assert no_version.status_code == 400 and no_version.json()["error"]["param"] == "policy_version"
    original = {n: p.detach().clone() for n, p in host.model.named_parameters()}
    try:
        ok = httpx.post(f"{url}/rlvr/reload_weights", json={"path": str(tmp_path), "policy_version": 3})
        assert ok.status_code == 200 and ok.json()["policy_version"] == 3
        assert httpx.get(f"{url}/version").json()["base_policy_version"] == 3
        prompt = tokenizer("2+2=")["input_ids"]
        r = httpx.post(f"{url}/v1/completions", json={"model": NAME, "prompt": prompt, "max_tokens": 6,
                                                      "temperature": 0, "return_token_ids": True}).json()
        assert r["rlvr_policy_version"] == 3
        assert r["choices"][0]["token_ids"] == greedy_ids(model, prompt, 6, host.eos_ids, tokenizer.pad_token_id)
    finally:
        with torch.no_grad():
            for n, p in host.model.named_parameters():
                p.copy_(original[n])
        host.base_version = 0


def test_concurrent_clients_are_batched(url, host, tokenizer):
    n = 16
    prompt = tokenizer("9+9=")["input_ids"]
    barrier = threading.Barrier(n)
    outs: list = []

    def call() -> None:
        with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60) as c:
            barrier.wait(timeout=10)
            r = c.completions.create(model=NAME, prompt=prompt, max_tokens=24, seed=len(outs),
                                     extra_body={"return_token_ids": True, "ignore_eos": False})
            outs.append(r)

    before = host.engine.batches
    threads = [threading.Thread(target=call) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(outs) == n
    batches = host.engine.batches - before
    assert 1 <= batches < n, batches


def test_serve_subprocess_starts_and_stops(base):
    """`rlvr serve` as a child process: health, a completion, and gone after the with block."""
    with ServerProcess(base, served_model_name=NAME, served_version=4, startup_timeout_s=120) as server:
        r = httpx.post(f"{server.url}/v1/completions", json={"model": NAME, "prompt": [5, 6], "max_tokens": 2,
                                                             "return_token_ids": True}, timeout=30)
        assert r.status_code == 200 and len(r.json()["choices"][0]["token_ids"]) <= 2
        assert r.json()["rlvr_policy_version"] == 4
        pid = server.proc.pid
    assert _gone(pid, 5)


def test_serve_subprocess_start_failure_is_clear(tmp_path):
    with pytest.raises(BackendError, match="exited before") as info:
        ServerProcess(tmp_path / "no-model", startup_timeout_s=60).start()
    assert "no-model" in str(info.value)  # the command and the log tail are quoted


def test_server_dies_with_its_sigkilled_parent(base):
    code = ("import sys, time\nfrom rlvr.backends.serve.process import ServerProcess\n"
            f"s = ServerProcess({str(base)!r}, startup_timeout_s=120).start()\n"
            "print(s.proc.pid, s.port, flush=True)\ntime.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(parent.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout=120)
    try:
        child_pid, port = map(int, line[0].split())
        assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
    assert _gone(child_pid, 10), "the server outlived its SIGKILLed parent"
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)


def _gone(pid: int, within_s: float) -> bool:
    """The process has exited (a zombie waiting for its new parent to reap it counts as exited)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        except OSError:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
        time.sleep(0.1)
    return False


def test_a_groups_samples_go_out_as_one_request_with_n_choices(url, tokenizer):
    import asyncio

    from rlvr.backends.sample.http import HTTPGenerator

    gen = HTTPGenerator(url, _served_name(url), max_concurrency=4)
    prompt = render_prompt_ids(tokenizer, [{"role": "user", "content": "12+34="}])
    other = render_prompt_ids(tokenizer, [{"role": "user", "content": "5+6="}])
    params = SamplingParams(max_tokens=6, temperature=1.0)

    async def group():
        calls = [gen.generate(prompt, params, seed=i) for i in range(8)]
        calls += [gen.generate(other, params, seed=100 + i) for i in range(3)]
        return await asyncio.gather(*calls)

    outs = asyncio.run(group())
    assert gen.calls == 2  # one request per distinct prompt, n = its number of samples
    assert len({o.ids for o in outs[:8]}) > 1  # the n choices are distinct draws
    assert all(len(o.ids) == len(o.logprobs) for o in outs)

    async def alone():
        return await asyncio.gather(*(gen.generate(prompt, params, seed=i) for i in range(8)))

    assert asyncio.run(alone()) == asyncio.run(alone())  # one request: the same seed draws the same


def _served_name(url):
    import httpx

    return httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
