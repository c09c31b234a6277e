"""``rlvr serve``'s decoding: slices that stop and resume draw what one uninterrupted generate draws,
a small request is answered beside a big one, tokens stream as they are generated, and
``top_logprobs`` (up to 20) are the in-process engine's processed distribution."""

from __future__ import annotations

import json
import threading
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from rlvr.backends.model.io import load_model, load_tokenizer  # noqa: E402
from rlvr.backends.model.tiny import build_tiny_model  # noqa: E402
from rlvr.backends.sample.batched import sample_batch  # noqa: E402
from rlvr.backends.sample.processing import penalise, processed_logprobs  # noqa: E402
from rlvr.backends.serve.app import ModelHost, serve_in_thread  # noqa: E402
from rlvr.backends.serve.decoding import Row, decode_slice  # noqa: E402
from rlvr.backends.serve.process import free_port  # noqa: E402
from rlvr.types import SamplingParams  # noqa: E402

pytestmark = pytest.mark.train


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "base", hidden=32, layers=2, heads=2, seed=0)


@pytest.fixture(scope="module")
def model(base):
    return load_model(str(base), dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def served(base):
    host = ModelHost(base, served_model_name="tiny", max_batch=64)
    with serve_in_thread(host, port=free_port()) as url:
        yield host, url


def _tokens(events, rows):
    return [[e[1] for e in events if e[0] == i] for i in range(rows)]


def test_a_slice_cut_and_resumed_beside_fresh_rows_draws_what_one_generate_draws(model):
    params = SamplingParams(max_tokens=10, temperature=0.8, top_k=12, repetition_penalty=1.3)
    prompts = [(5, 6, 7), (5, 6, 7), (9, 10, 11, 12), (40, 41)]
    seeds = [11, 12, 13, 14]
    whole = sample_batch(model, prompts, params, seed=seeds, eos_ids={2}, pad_id=0, share_prompts=True)
    events: list = []
    counts = decode_slice(model, [Row(p, s, 0, 10) for p, s in zip(prompts[:2], seeds[:2], strict=True)], params,
                          eos_ids={2}, pad_id=0, top_n=0, on_token=events.append, yield_now=lambda: True, min_steps=4)
    first = _tokens(events, 2)
    assert counts == [len(t) for t in first] and all(len(t) <= 4 for t in first)
    # The two cut rows resume (offsets 4) in one slice with two fresh rows (offset 0).
    rows = [Row(prompts[i] + tuple(first[i]), seeds[i], len(first[i]), 10 - len(first[i])) for i in range(2)]
    rows += [Row(prompts[i], seeds[i], 0, 10) for i in (2, 3)]
    events = []
    decode_slice(model, rows, params, eos_ids={2}, pad_id=0, top_n=0, on_token=events.append)
    rest = _tokens(events, 4)
    assert [first[0] + rest[0], first[1] + rest[1], rest[2], rest[3]] == [list(c.ids) for c in whole]


def test_a_row_stops_at_its_own_budget_and_a_cancelled_row_at_the_next_step(model):
    params = SamplingParams(max_tokens=1, temperature=1.0)
    events: list = []
    decode_slice(model, [Row((5, 6), 1, 0, 3), Row((5, 6), 2, 0, 9), Row((7, 8), 3, 0, 9)], params,
                 eos_ids=set(), pad_id=0, top_n=0, on_token=events.append, cancelled=lambda i: i == 2)
    assert [len(t) for t in _tokens(events, 3)] == [3, 9, 1]
    assert [e[4] for e in events if e[0] == 0][-1] == "length"


def reference_tops(model, prompt, completion, params, k):
    """The top-``k`` of the processed distribution at each completion position, by one forward pass."""
    ids = torch.tensor([list(prompt) + list(completion)])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float()
    if params.repetition_penalty != 1.0:
        seen = torch.zeros_like(logits, dtype=torch.bool)
        seen[:, list(prompt)] = True
        for t in range(1, len(completion)):
            seen[t:, completion[t - 1]] = True
        penalise(logits, seen, params.repetition_penalty)
    values, index = processed_logprobs(logits, params).topk(k, dim=-1)
    return index.tolist(), values.tolist()


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_top_logprobs_are_the_processed_distributions_twenty_most_likely(served, base, model, temperature):
    host, url = served
    tokenizer = load_tokenizer(str(base))
    body = {"model": "tiny", "messages": [{"role": "user", "content": "9+9="}], "max_tokens": 6, "seed": 3,
            "temperature": temperature, "top_k": 30, "logprobs": True, "top_logprobs": 20, "return_token_ids": True}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    choice = out["choices"][0]
    params = SamplingParams(max_tokens=6, temperature=temperature, top_k=30)
    ids, values = reference_tops(model, out["prompt_token_ids"], choice["token_ids"], params, 20)
    for k, entry in enumerate(choice["logprobs"]["content"]):
        tops = entry["top_logprobs"]
        assert len(tops) == 20
        assert [t["token"] for t in tops[:5]] == [tokenizer.decode([i]) for i in ids[k][:5]]
        got = [t["logprob"] for t in tops]
        # top_k = 30 keeps 30 tokens: all 20 are finite and match the forward pass
        assert got == pytest.approx(values[k], abs=1e-4)
    assert httpx.post(f"{url}/v1/chat/completions", json={**body, "top_logprobs": 21}, timeout=30).status_code == 400
    completion = httpx.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": out["prompt_token_ids"],
                                                           "max_tokens": 3, "logprobs": 20, "seed": 3}, timeout=30)
    assert all(len(row) >= 20 for row in completion.json()["choices"][0]["logprobs"]["top_logprobs"])


def test_the_first_chunk_arrives_while_the_rest_is_still_being_generated(served):
    _, url = served
    body = {"model": "tiny", "prompt": [9, 10, 80], "max_tokens": 200, "stream": True, "seed": 1,
            "allowed_token_ids": list(range(10, 90))}  # no eos: all 200 tokens are generated
    start = time.monotonic()
    arrivals: list[float] = []
    texts: list[str] = []
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                arrivals.append(time.monotonic())
                texts.append(json.loads(line[6:])["choices"][0]["text"])
    whole = httpx.post(f"{url}/v1/completions", json={**body, "stream": False}, timeout=120).json()
    assert "".join(texts) == whole["choices"][0]["text"]
    total = arrivals[-1] - start
    # Sent after the fact, every chunk would arrive within a few ms of the last.
    assert arrivals[0] - start < 0.5 * total, (arrivals[0] - start, total)


def test_a_small_request_is_answered_while_a_big_one_generates(served):
    host, url = served
    big_done: list[float] = []

    def big() -> None:
        body = {"model": "tiny", "prompt": [9, 10, 80], "n": 128, "max_tokens": 200, "seed": 2,
                "allowed_token_ids": list(range(10, 90))}
        assert httpx.post(f"{url}/v1/completions", json=body, timeout=300).status_code == 200
        big_done.append(time.monotonic())

    before = host.engine.batches
    thread = threading.Thread(target=big)
    thread.start()
    while host.engine.batches == before:  # the big request is generating
        time.sleep(0.01)
    asked = time.monotonic()
    small = httpx.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": [9, 10], "max_tokens": 2},
                       timeout=60)
    answered = time.monotonic()
    thread.join()
    assert small.status_code == 200
    assert big_done and answered < big_done[0], "the small request waited for the whole big one"
    # it joins between slices of the big one: a small part of the big one's time, on a quiet or a busy machine
    assert answered - asked < (big_done[0] - asked) / 4
