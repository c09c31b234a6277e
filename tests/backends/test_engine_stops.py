"""The in-process engine gives a batch up at its next token once no one waits for it: when its engine
closes (a run failing mid-generation must find no engine thread inside torch as the process exits: the
interpreter then aborts, "terminate called without an active exception", and the run's error status
is lost) and when every caller stopped waiting (a rollout timeout), so the device is not held to the
batch's last token."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from rlvr.backends.model.policy import Policy  # noqa: E402
from rlvr.backends.model.tiny import build_tiny_model  # noqa: E402
from rlvr.backends.sample.engine import InProcessEngine  # noqa: E402
from rlvr.errors import BackendError  # noqa: E402
from rlvr.types import SamplingParams  # noqa: E402

pytestmark = pytest.mark.train

LONG = SamplingParams(temperature=1.0, max_tokens=200)
STEP_S = 0.02  # each forward pass slowed, so 200 tokens take 4 s or more


@pytest.fixture
def slow_engine(tmp_path):
    """An engine over the tiny model whose forward passes are counted and slowed to ``STEP_S`` each,
    with no eos token, so a completion runs to ``max_tokens``."""
    base = build_tiny_model(tmp_path / "base", hidden=32, layers=2, heads=2, seed=0)
    policy = Policy(str(base), lora=None, need_reference=False)
    passes = [0]

    def slowed(module, args, kwargs):
        passes[0] += 1
        time.sleep(STEP_S)

    policy.model.register_forward_pre_hook(slowed, with_kwargs=True)
    engine = InProcessEngine(policy.model, eos_ids=set(), pad_id=policy.tokenizer.pad_token_id)
    yield engine, passes
    engine.close()


def _generate_in_thread(engine: InProcessEngine, timeout_s: float | None = None) -> tuple[threading.Thread, list]:
    """One ``generate`` on an event loop of its own thread; its outcome (completion or error) lands in the list."""
    outcome: list = []

    async def ask():
        return await asyncio.wait_for(engine.generate([1, 2, 3], LONG, seed=0), timeout_s)

    def run():
        try:
            outcome.append(asyncio.run(ask()))
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def _wait_for(condition, within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


def test_a_closing_engine_ends_the_batch_under_way_at_its_next_token(slow_engine):
    engine, passes = slow_engine
    caller, outcome = _generate_in_thread(engine)
    _wait_for(lambda: passes[0] >= 3)  # mid-batch
    engine.close()
    caller.join(5)
    assert not engine._thread.is_alive()
    assert passes[0] < 50, f"the batch went on for {passes[0]} of 200 tokens after the close"
    assert len(outcome) == 1 and isinstance(outcome[0], BackendError) and "abandoned" in str(outcome[0])


def test_a_batch_every_caller_stopped_waiting_for_ends_and_the_engine_serves_on(slow_engine):
    engine, passes = slow_engine
    caller, outcome = _generate_in_thread(engine, timeout_s=0.2)
    caller.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], TimeoutError)
    at_timeout = passes[0]
    time.sleep(0.5)  # 25 more tokens' time, had the batch gone on
    assert passes[0] - at_timeout <= 2, f"{passes[0] - at_timeout} forward passes after every caller left"

    short = SamplingParams(temperature=1.0, max_tokens=4)
    completion = asyncio.run(engine.generate([1, 2, 3], short, seed=1))
    assert len(completion.ids) == 4  # the engine answers the next batch as before
