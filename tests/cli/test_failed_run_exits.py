"""A run that fails ends in its Python exception (``rlvr.train``) or its exit status and one line
(``rlvr train``), never in SIGABRT from a worker thread left inside torch as the interpreter exits
("terminate called without an active exception", status 134; in Jupyter, a dead kernel). Each case
fails at step 0's held-out pass, as a real model's first run on a busy CPU did."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

import rlvr  # noqa: E402
from rlvr.errors import RLLoopError  # noqa: E402

pytestmark = pytest.mark.train

SRC = Path(__file__).resolve().parents[2] / "src"
ABORTS = (134, -signal.SIGABRT)
SMALL = dict(hidden=32, layers=2, heads=2, threads=1, max_steps=1, tasks_per_step=2, group_k=2, lora_rank=2,
             max_new_tokens=4, progress="off", **{"watchdog.enabled": False})


def rows(n: int = 120) -> list[dict]:
    return [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(n)]


def broken_on_heldout(completions, **kwargs):
    raise ValueError("this reward cannot read the held-out rows")


def reward_len(completions, **kwargs):
    return [-abs(4 - len(c)) for c in completions]


def python(script: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


# The real model's case, on the tiny model: the held-out pass takes the device first (training rollouts
# start 0.5 s late), the training engine then enters a long forward pass ({seconds} s of torch work on
# one thread), and the held-out reward fails meanwhile. A process that finalizes while that forward
# pass runs aborts; the pass outlasts the engine's own close() wait.
STUBBORN = """
import asyncio, threading, time
import torch
import rlvr.backends.rollout.setup as rollout_setup
import rlvr.backends.sample.engine as engine

torch.set_num_threads(1)
real_batch, real_single = engine.sample_batch, rollout_setup.single_turn

def stubborn(*args, **kwargs):
    if threading.current_thread().name != "rlvr-heldout":
        until, a = time.monotonic() + {seconds}, torch.randn(96, 96)
        while time.monotonic() < until:
            a = (a @ a).tanh()
    return real_batch(*args, **kwargs)

def late_training(setup):
    fn = real_single(setup)
    if setup.extras.get("agent_phase") != "train":
        return fn

    async def rollout(row):
        await asyncio.sleep(0.5)
        return await fn(row)

    return rollout

engine.sample_batch, rollout_setup.single_turn = stubborn, late_training
"""


def test_an_engine_left_generating_at_exit_does_not_abort_the_process(tmp_path):
    script = """
    import asyncio, tempfile, threading
    from pathlib import Path
    import torch
    from rlvr.backends.model.policy import Policy
    from rlvr.backends.model.tiny import build_tiny_model
    from rlvr.backends.sample.engine import InProcessEngine
    from rlvr.types import SamplingParams

    base = build_tiny_model(Path(tempfile.mkdtemp()) / "base", hidden=32, layers=2, heads=2, seed=0)
    policy = Policy(str(base), lora=None, need_reference=False)
    started = threading.Event()

    def slowed(module, args, kwargs):  # torch work on every forward pass, as a real model's
        started.set()
        a = torch.randn(96, 96)
        for _ in range(200):
            a = (a @ a).tanh()

    policy.model.register_forward_pre_hook(slowed, with_kwargs=True)
    engine = InProcessEngine(policy.model, eos_ids=set(), pad_id=policy.tokenizer.pad_token_id)

    def ask():
        try:
            asyncio.run(engine.generate([1, 2, 3], SamplingParams(temperature=1.0, max_tokens=400), seed=0))
        except Exception:
            pass

    threading.Thread(target=ask, daemon=True).start()
    started.wait(60)
    raise RuntimeError("the run failed while its engine was generating")  # nobody closes the engine
    """
    done = python(script, tmp_path)
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    assert "terminate called" not in done.stderr
    assert done.stderr.rstrip().splitlines()[-1] == "RuntimeError: the run failed while its engine was generating"


def test_a_cli_run_failing_at_step_0_exits_with_its_status_and_one_line(tmp_path):
    (tmp_path / "reward.py").write_text("def reward_fn(messages, answer):\n"
                                        "    raise ValueError('this reward cannot read the held-out rows')\n")
    script = """
    import sys
    from rlvr.cli.commands import main
    sys.exit(main(["train", "--out", "run", "--task.env=reward.py", "--task.n=120", "--model.hidden=32",
                   "--model.layers=2", "--model.heads=2", "--model.threads=1", "--loop.max_steps=1",
                   "--loop.tasks_per_step=2", "--loop.group_k=2", "--loop.lora_rank=2",
                   "--sampler.max_new_tokens=4", "--log.progress=off", "--watchdog.enabled=false"]))
    """
    done = python(script, tmp_path)
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "terminate called" not in done.stderr and "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("rlvr: error:")]
    assert len(errors) == 1 and "held-out task" in errors[0] and "cannot read the held-out rows" in errors[0]


def test_a_failed_notebook_run_raises_and_the_next_call_works(tmp_path):
    with pytest.raises(RLLoopError, match="held-out task .*cannot read the held-out rows"):
        rlvr.train("tiny", rows(), broken_on_heldout, out=tmp_path / "a", **SMALL)
    record = rlvr.train("tiny", rows(), reward_len, out=tmp_path / "b", **SMALL)  # the interpreter lives on
    assert record.finished is not None and record.finished.data["stop_cause"] == "max_steps"


@pytest.mark.slow
def test_a_run_failing_while_its_engine_is_deep_in_a_forward_pass_exits_with_its_error(tmp_path):
    script = STUBBORN.format(seconds=40) + f"""
import rlvr
SMALL = {SMALL!r}
rows = [{{"prompt": f"{{i}}+1=", "answer": str(i + 1)}} for i in range(120)]
def broken_on_heldout(completions, **kwargs):
    time.sleep(3.0)  # the training engine is in its long forward pass by now
    raise ValueError("this reward cannot read the held-out rows")
rlvr.train("tiny", rows, broken_on_heldout, out="run", **SMALL)
"""
    done = python(textwrap.indent(script, ""), tmp_path)
    assert done.returncode not in ABORTS and "terminate called" not in done.stderr, done.stderr[-2000:]
    assert done.returncode == 1
    lines = done.stderr.rstrip().splitlines()
    error = [line for line in lines if line.startswith("rlvr.errors.RLLoopError: held-out task")]
    assert error and "cannot read the held-out rows" in error[0]
    assert lines[-1] == "rlvr: waiting for rlvr-engine to end its forward pass before exiting"  # then it exits
