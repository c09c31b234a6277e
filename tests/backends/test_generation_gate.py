"""One generation at a time per device: the gate's counters, and two engines on one model that
never generate at once (the held-out evaluator's and the rollouts')."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from rlvr.backends.model.policy import Policy  # noqa: E402
from rlvr.backends.model.tiny import build_tiny_model  # noqa: E402
from rlvr.backends.sample import engine as engine_module  # noqa: E402
from rlvr.backends.sample.engine import InProcessEngine  # noqa: E402
from rlvr.backends.sample.gate import DeviceGate, gate_for  # noqa: E402
from rlvr.types import SamplingParams  # noqa: E402

pytestmark = pytest.mark.train


def test_the_gate_counts_calls_waits_and_busy_time_by_name_on_a_fake_clock():
    now = [0.0]
    gate = DeviceGate(clock=lambda: now[0])
    with gate.hold("rollouts"):
        now[0] += 2.0
    now[0] += 1.0
    with gate.hold("heldout"):
        now[0] += 0.5
    readings = gate.readings()
    assert readings["perf/gen/rollouts/calls"] == 1 and readings["perf/gen/rollouts/busy_s"] == 2.0
    assert readings["perf/gen/heldout/busy_s"] == 0.5 and readings["perf/gen/heldout/wait_s"] == 0.0
    assert readings["perf/gen/most_at_once"] == 1 and gate.inside == 0


def test_a_holder_that_raises_releases_the_device():
    gate = DeviceGate()
    with pytest.raises(RuntimeError), gate.hold("a"):
        raise RuntimeError("generate failed")
    with gate.hold("b"):  # would deadlock if the first holder had kept it
        assert gate.inside == 1


def test_a_second_holder_waits_and_its_wait_is_counted():
    gate, inside = DeviceGate(), threading.Event()
    release = threading.Event()

    def first():
        with gate.hold("rollouts"):
            inside.set()
            release.wait(5)

    worker = threading.Thread(target=first)
    worker.start()
    inside.wait(5)
    threading.Timer(0.2, release.set).start()
    with gate.hold("heldout"):
        assert gate.inside == 1
    worker.join()
    assert gate.readings()["perf/gen/heldout/wait_s"] >= 0.15


def test_every_engine_on_a_device_shares_its_gate():
    assert gate_for("cpu") is gate_for(__import__("torch").device("cpu"))


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    base = build_tiny_model(tmp_path_factory.mktemp("tiny") / "base", hidden=32, layers=2, heads=2, seed=0)
    return Policy(str(base), lora=None, need_reference=False)


def _concurrent_generation(policy, monkeypatch, gates):
    """Two engines on one live model (rollouts and held-out), each asked for three batches from its own
    thread at once; ``sample_batch`` slowed and watched: the most calls it saw running at once."""
    running, most = [0], [0]
    lock = threading.Lock()
    real = engine_module.sample_batch

    def watched(*args, **kwargs):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        try:
            deadline = time.monotonic() + 0.15  # time for the other engine's call to arrive meanwhile
            while running[0] < 2 and time.monotonic() < deadline:
                time.sleep(0.005)
            return real(*args, **kwargs)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(engine_module, "sample_batch", watched)
    common = {"eos_ids": policy.eos_ids, "pad_id": policy.tokenizer.pad_token_id, "version": lambda: 0}
    engines = [InProcessEngine(policy.model, name=name, gate=gate, **common)
               for name, gate in zip(("rlvr-engine", "rlvr-heldout"), gates, strict=True)]

    def drive(engine, temperature):
        async def batches():
            for i in range(3):
                await engine.generate([9, 10, 11], SamplingParams(max_tokens=3, temperature=temperature), seed=i)
        asyncio.run(batches())

    threads = [threading.Thread(target=drive, args=(e, t)) for e, t in zip(engines, (1.0, 0.0), strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for e in engines:
        e.close()
    return most[0]


def test_heldout_and_rollout_engines_never_generate_at_once_on_one_device(policy, monkeypatch):
    gate = DeviceGate()
    assert _concurrent_generation(policy, monkeypatch, [gate, gate]) == 1
    readings = gate.readings()
    assert readings["perf/gen/most_at_once"] == 1
    assert readings["perf/gen/rlvr-engine/calls"] == readings["perf/gen/rlvr-heldout/calls"] == 3
    # each waited for the other at least once: the calls really did contend
    assert readings["perf/gen/rlvr-engine/wait_s"] + readings["perf/gen/rlvr-heldout/wait_s"] > 0.04


def test_without_a_shared_gate_the_same_load_does_overlap(policy, monkeypatch):
    """The control: the watcher sees overlap when the engines hold separate gates."""
    assert _concurrent_generation(policy, monkeypatch, [DeviceGate(), DeviceGate()]) == 2
