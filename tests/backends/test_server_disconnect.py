"""``rlvr serve`` stops generating for a client that went away: a real server on loopback, a client
that gives up on a long request (whole or streamed) and closes its connection; the request's rows
stop well before their budget and the model is idle again, ready for the next client."""

from __future__ import annotations

import json
import socket
import time

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from rlvr.backends.model.tiny import build_tiny_model  # noqa: E402
from rlvr.backends.serve.app import ModelHost, serve_in_thread  # noqa: E402
from rlvr.backends.serve.process import free_port  # noqa: E402

pytestmark = pytest.mark.train
BUDGET = 1500


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    base = build_tiny_model(tmp_path_factory.mktemp("tiny") / "base", hidden=64, layers=4, heads=2, seed=0,
                            max_positions=2048)
    host = ModelHost(base, served_model_name="tiny")
    host.engine.eos_ids = set()  # every row runs to its budget unless stopped: a long generation for sure
    steps: dict[int, int] = {}  # job -> tokens its rows drew, whether or not anyone still waited for them
    token = host.scheduler._token

    def count(job, event):
        steps[id(job)] = steps.get(id(job), 0) + 1
        token(job, event)

    host.scheduler._token = count
    with serve_in_thread(host, port=free_port()) as url:
        yield url, host, steps


def _idle(host, within_s: float) -> bool:
    """The model is idle (no job queued, no slice running) twice in a row, within ``within_s``."""
    deadline, seen = time.monotonic() + within_s, 0
    while time.monotonic() < deadline and seen < 2:
        seen = seen + 1 if not host.scheduler.pending and not host.scheduler.lock.locked() else 0
        time.sleep(0.05)
    return seen >= 2


def _give_up(url: str, body: dict, started, within_s: float = 120) -> None:
    """Send ``body`` on a raw connection, wait until ``started()`` (its generation is under way),
    and close the connection without reading the answer."""
    port = int(url.rsplit(":", 1)[1])
    raw = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(raw)}\r\n\r\n".encode() + raw)
        deadline = time.monotonic() + within_s
        while not started() and time.monotonic() < deadline:
            time.sleep(0.01)
    assert started(), "the generation never started"


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_disconnects_stops_its_generation(served, stream):
    url, host, steps = served
    steps.clear()
    body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": BUDGET, "n": 4, "temperature": 1.0, "stream": stream}
    _give_up(url, body, started=lambda: sum(steps.values()) >= 4)
    assert _idle(host, within_s=60), "the server kept generating for a client that had left"
    assert len(steps) == 4 and max(steps.values()) < BUDGET / 2
    r = httpx.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 3}, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
