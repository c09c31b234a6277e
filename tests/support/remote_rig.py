"""What the remote-rollout tests share: a fake run over any rollout function; its record made comparable
with a local run's (the rollout seam's own description, the workers' warning events and the
checkpoints' record offsets, which count those events, left out); an `rlvr rollout-worker` app served
from a thread, running the fakes' rollout function (:data:`SPEC`). Standard library + rlvr's fakes;
the worker imports uvicorn and the worker app when one is started."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

from conftest import record_files, small_config
from rlvr import RLLoop
from rlvr.testing import FakeTrainer, ScriptedEvaluator, exact_match, make_rows


def run(out: Path, rollout_fn: Any, **overrides: Any) -> RLLoop:
    loop = RLLoop.from_reward(small_config(**overrides), exact_match, make_rows(40), rollout_fn=rollout_fn,
                              trainer=FakeTrainer(), heldout_eval=ScriptedEvaluator(lambda s: 0.1 + 0.01 * s),
                              out_dir=out)
    loop.run()
    return loop


def comparable(out: Path) -> dict[str, list[str]]:
    files = record_files(out)
    info = json.loads(files["run.json"][0])
    info["seams"].pop("rollout_fn")
    files["run.json"] = [json.dumps(info, sort_keys=True)]
    files["events.jsonl"] = [e for e in files["events.jsonl"] if '"kind": "warning"' not in e]
    for name in [n for n in files if n.startswith("checkpoints/")]:
        state = json.loads(files[name][0])
        state.pop("record_offsets")
        files[name] = [json.dumps(state, sort_keys=True)]
    return files


SPEC = {"factory": "rlvr.testing:FakeRolloutFn", "kwargs": {"skill": 0.5, "seed": 1}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Worker:
    """An rlvr rollout-worker app served from a thread on ``port``; ``stop()`` takes it down for good."""

    def __init__(self, port: int | None = None, **app_kwargs: Any):
        import uvicorn

        from rlvr.backends.rollout.app import create_app
        from rlvr.backends.rollout.worker import WorkerCore

        self.port = port or free_port()
        self.core = WorkerCore(app_kwargs.pop("allowed_dirs", None), app_kwargs.pop("allow_modules", None))
        self.server = uvicorn.Server(uvicorn.Config(create_app(self.core, **app_kwargs), host="127.0.0.1",
                                                    port=self.port, log_level="warning", access_log=False,
                                                    timeout_graceful_shutdown=1))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the worker did not start"
            time.sleep(0.01)
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
