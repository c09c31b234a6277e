"""``rlvr serve`` under every attack at once: how long a well-behaved client waits.

One server (the tiny model, the limits ``rlvr serve`` starts with), a small chat request (2 tokens)
and ``/health`` timed first on the idle server (the baseline), then while all of these run at once:
a template bomb (``{{ 'a' * 200000000 }}``), an 8 MB prompt, ``--slow`` connections trickling their
body one byte a second (more than the in-flight slots), and an ``n=256, max_tokens=200`` request.
Prints each latency, the ratio to the idle baseline and the goals (small request < 2 s, ``/health``
< 1 s), and how the attacks were answered (413 for the bomb and the big prompt, 408 for the slow
bodies, 200 for the big request).

    python bench/serve_under_attack.py [--slow 70] [--rounds 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx
import torch

from rlvr.backends.model.tiny import build_tiny_model
from rlvr.backends.serve.app import ModelHost, serve_in_thread
from rlvr.backends.serve.model_host import ServerPolicy
from rlvr.backends.serve.process import free_port

SMALL = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
ATTACKS = {
    "big": ("/v1/completions", {"model": "tiny", "prompt": [9, 10, 80], "n": 256, "max_tokens": 200}),
    "bomb": ("/v1/chat/completions", {**SMALL, "chat_template": "{{ 'a' * 200000000 }}"}),
    "8mb": ("/v1/completions", {"model": "tiny", "prompt": "x " * (4 * 2**20)}),
}


def timed(call) -> float:
    start = time.monotonic()
    response = call()
    assert response.status_code == 200, (response.status_code, response.text[:300])
    return time.monotonic() - start


def latencies(url: str, rounds: int) -> tuple[list[float], list[float]]:
    health = [timed(lambda: httpx.get(f"{url}/health", timeout=60)) for _ in range(rounds)]
    small = [timed(lambda: httpx.post(f"{url}/v1/chat/completions", json=SMALL, timeout=60)) for _ in range(rounds)]
    return health, small


def slow_body(url: str, answers: list[str]) -> socket.socket:
    """A connection that declares a body and sends it one byte a second (slowloris)."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    body = json.dumps(SMALL).encode()
    sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n".encode())

    def trickle() -> None:
        try:
            for byte in body:
                sock.sendall(bytes([byte]))
                sock.settimeout(1.0)
                try:
                    answers.append(sock.recv(4096).split(b"\r\n")[0].decode())
                    return
                except TimeoutError:
                    continue
        except OSError:
            answers.append("closed")

    threading.Thread(target=trickle, daemon=True).start()
    return sock


def attack_all(url: str, slow: int) -> tuple[dict[str, object], list[str], list[socket.socket], list[threading.Thread]]:
    outcomes: dict[str, object] = {}

    def post(name: str) -> None:
        path, body = ATTACKS[name]
        try:
            outcomes[name] = httpx.post(f"{url}{path}", json=body, timeout=600).status_code
        except httpx.HTTPError as exc:
            outcomes[name] = type(exc).__name__

    answers: list[str] = []
    socks = [slow_body(url, answers) for _ in range(slow)]
    threads = [threading.Thread(target=post, args=(name,), daemon=True) for name in ATTACKS]
    for t in threads:
        t.start()
    return outcomes, answers, socks, threads


def summary(name: str, under: list[float], idle: list[float], goal_s: float) -> str:
    worst, base, median = max(under), statistics.median(idle), statistics.median(under)
    return (f"{name:<14} idle median {base * 1e3:8.1f} ms | under attack median {median * 1e3:8.1f} ms,"
            f" max {worst * 1e3:8.1f} ms | ratio {worst / base:7.1f}x | goal < {goal_s:.0f} s: "
            f"{'met' if worst < goal_s else 'NOT met'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slow", type=int, default=70, help="slow connections (the audit used 70)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        base = build_tiny_model(Path(tmp) / "tiny", hidden=32, layers=2, heads=2, seed=0)
        host = ModelHost(base, served_model_name="tiny", policy=ServerPolicy(), max_batch=256)
        with serve_in_thread(host, port=free_port()) as url:
            idle_health, idle_small = latencies(url, args.rounds)
            before = host.engine.batches
            outcomes, answers, socks, threads = attack_all(url, args.slow)
            while host.engine.batches == before:  # the big request is generating
                time.sleep(0.01)
            time.sleep(0.3)  # and the bomb is rendering
            health, small = latencies(url, args.rounds)
            big_running = "big" not in outcomes
            for t in threads:
                t.join(timeout=600)
            deadline = time.monotonic() + host.policy.body_timeout_s + 5  # the slow bodies' 408s
            while len(answers) < args.slow and time.monotonic() < deadline:
                time.sleep(0.1)
            for sock in socks:
                sock.close()
    print(f"rlvr serve under attack: {args.slow} slow bodies, a template bomb, an 8 MB prompt, n=256 x 200 tokens; "
          f"{args.rounds} rounds, {args.threads} threads")
    print(summary("/health", health, idle_health, 1.0))
    print(summary("small request", small, idle_small, 2.0))
    print(f"the big request was still generating while they were answered: {big_running}")
    print(f"attacks answered: {outcomes}; slow bodies: "
          f"{ {s: answers.count(s) for s in sorted(set(answers))} } of {args.slow}")


if __name__ == "__main__":
    main()
