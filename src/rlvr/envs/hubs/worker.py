"""The hub worker: run in the hub environments' own Python (``.venv-hubs``, ``make hubs``), it loads a
hub environment and plays its episodes against a base URL (the recording proxy's, one per episode).

It speaks JSON lines over a private channel, a socket whose fd is its one argument
(``worker.py CHANNEL_FD``, one end of a socket pair): a request ``{"id", "op", ...}`` is answered
by ``{"id", "ok": true, "result"}`` or ``{"id", "ok": false, "error"}``; requests run
concurrently, one thread each. Ops: ``rows`` (the hub's tasks as rlvr rows) and ``episode`` (one
episode of a row against ``base_url``: the conversation, the hub's reward and metrics). This file
imports nothing of rlvr: the hub's Python has its own packages (verifiers 0.4 pins ``openai<3``),
not rlvr's.

What it keeps invariant: nothing an environment or its programs print can become a reply. The
environment's code prints what the model said (an action echoed, a log line), so stdout is not the
channel: at start fd 1 and ``sys.stdout`` are pointed at stderr (the run's log, which the trainer
only prints), and the channel's fd is made non-inheritable, so no program an episode starts holds
it (nor can one open it through ``/proc``, as it could a pipe). And nothing outlives the trainer:
when the channel ends (the trainer closed it, or died), the worker kills its process group, which
``HubWorker`` makes its own, so the episodes' programs go with it.

Hubs:
- ``openenv``: an OpenEnv ``Environment`` subclass (``package.module:Class``), instantiated per
  episode with ``args``. A row is a reset seed; its prompt is the first observation's text. Each
  model reply becomes the action (the action class's one text field, or ``action_field``); each
  observation's text the next user message, until ``done`` or ``max_turns``. The reward is the sum
  of the observations' rewards.
- ``verifiers``: a verifiers 0.4 ``v1`` taskset (its id: an importable module exporting a
  ``Taskset``), played by a ``SingleAgentEnv`` whose agent is the harness ``harness`` (default
  ``null``, verifiers' own chat program) in a subprocess runtime, its model client pointed at the
  episode's base URL through verifiers' interception server. Rows are the taskset's tasks; the
  reward is the sum of the trace's weighted ``@reward`` scores.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import importlib.util
import inspect
import json
import os
import signal
import socket
import sys
import threading
import traceback
import typing
from typing import Any

TEXT_FIELDS = ("prompt", "text", "message", "content", "observation", "question")


# ---- OpenEnv ------------------------------------------------------------------------------------------
@functools.cache
def load_object(spec: str) -> Any:
    """``package.module:attr`` or ``path/file.py:attr``, loaded once per worker: a file is executed on
    first use only, so every episode plays the same class (and the file's module-level state is not
    rebuilt per episode)."""
    module, _, attr = spec.rpartition(":") if spec.count(":") > 1 or spec.split(":")[0].endswith(".py") \
        else spec.partition(":")
    if module.endswith(".py"):
        loaded = importlib.util.spec_from_file_location(f"rlvr_hub_{abs(hash(module))}", module)
        if loaded is None or loaded.loader is None:
            raise ImportError(f"{module!r}: not a Python file the worker can load")
        obj = importlib.util.module_from_spec(loaded)
        loaded.loader.exec_module(obj)
    else:
        obj = importlib.import_module(module)
    for part in filter(None, attr.split(".")):
        obj = getattr(obj, part)
    return obj


def observation_text(obs: Any) -> str:
    """The text a model reads of an observation: its one text field, else its fields as JSON."""
    data = obs.model_dump() if hasattr(obs, "model_dump") else dict(obs)
    for key in TEXT_FIELDS:
        if isinstance(data.get(key), str):
            return data[key]
    return json.dumps({k: v for k, v in data.items() if k not in ("done", "reward", "metadata")}, default=str)


def action_of(env: Any, text: str, field: str | None) -> Any:
    """The reply as the environment's action: its action class (``step``'s annotation) with the text
    in its one text field (or ``field``)."""
    hints = typing.get_type_hints(type(env).step)
    params = [p for p in inspect.signature(type(env).step).parameters if p != "self"]
    cls = hints.get(params[0]) if params else None
    if cls is None or not hasattr(cls, "model_fields"):
        raise TypeError(f"{type(env).__name__}.step has no pydantic Action annotation to build actions from")
    names = [n for n in cls.model_fields if n != "metadata"]
    if field is None:
        texts = [n for n in names if cls.model_fields[n].annotation is str]
        if len(texts) != 1:
            raise TypeError(f"{cls.__name__} has text fields {texts}: name the one replies go to with action_field")
        field = texts[0]
    return cls(**{field: text})


def openenv_rows(spec: str, args: dict[str, Any], n: int, seed: int) -> list[dict[str, Any]]:
    cls = load_object(spec)
    rows = []
    for i in range(n):
        obs = cls(**args).reset(seed=seed + i)
        answer = (getattr(obs, "metadata", None) or {}).get("answer")
        rows.append({"id": f"seed-{seed + i}", "prompt": observation_text(obs), "answer": answer,
                     "info": {"seed": seed + i}})
    return rows


def openenv_episode(spec: str, args: dict[str, Any], base_url: str, row: dict[str, Any], max_turns: int,
                    action_field: str | None, system_prompt: str | None) -> dict[str, Any]:
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    env = load_object(spec)(**args)
    obs = env.reset(seed=row["info"]["seed"])
    messages: list[Any] = ([{"role": "system", "content": system_prompt}] if system_prompt else [])
    messages.append({"role": "user", "content": observation_text(obs)})
    total, turns = 0.0, 0
    while turns < max_turns:
        turns += 1
        reply = client.chat.completions.create(model="policy", messages=messages).choices[0].message.content or ""
        messages.append({"role": "assistant", "content": reply})
        obs = env.step(action_of(env, reply, action_field))
        total += float(obs.reward or 0.0)
        if obs.done:
            break
        messages.append({"role": "user", "content": observation_text(obs)})
    return {"messages": messages, "reward": total, "metrics": {"turns": turns}}


# ---- verifiers 0.4 (v1) -------------------------------------------------------------------------------
class V1Env:
    """A loaded verifiers ``v1`` environment (a ``SingleAgentEnv`` over the taskset ``taskset_id``, its
    agent the harness ``harness`` in a subprocess runtime), serving on an event loop of its own; each
    episode's model client points at that episode's base URL."""

    def __init__(self, taskset_id: str, args: dict[str, Any], harness: str):
        import verifiers.v1 as vf
        from verifiers.v1.utils.loaders import load_environment

        self.vf = vf
        config = vf.SingleAgentEnvConfig(taskset={"id": taskset_id, **args},
                                         agent={"harness": {"id": harness}, "runtime": {"type": "subprocess"}})
        self.env = load_environment(config)
        self.tasks = list(self.env.taskset)
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="vf1-env", daemon=True).start()
        self.stack = contextlib.AsyncExitStack()
        asyncio.run_coroutine_threadsafe(self.stack.enter_async_context(self.env.serving()), self.loop).result()

    def episode(self, index: int, base_url: str) -> Any:
        vf = self.vf
        ctx = vf.ModelContext(client=vf.EvalClientConfig(base_url=base_url, api_key_var="RLVR_HUB_API_KEY"),
                              model="policy")
        return asyncio.run_coroutine_threadsafe(self.env.run_episode(self.tasks[index], ctx), self.loop).result()


_V1: dict[str, V1Env] = {}
_V1_LOCK = threading.Lock()


def v1_env(spec: str, args: dict[str, Any], harness: str) -> V1Env:
    key = json.dumps([spec, args, harness], sort_keys=True)
    with _V1_LOCK:
        if key not in _V1:
            _V1[key] = V1Env(spec, args, harness)
        return _V1[key]


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(str(getattr(p, "text", p.get("text", "") if isinstance(p, dict) else "")) for p in content)
    return "" if content is None else str(content)


def verifiers_rows(spec: str, args: dict[str, Any], n: int, harness: str) -> list[dict[str, Any]]:
    env = v1_env(spec, args, harness)
    rows = []
    for index, task in enumerate(env.tasks[:n]):
        prompt = task.data.prompt
        text = prompt if isinstance(prompt, str) else _text(getattr(prompt[-1], "content", "")) if prompt else ""
        rows.append({"id": f"{spec}-{task.data.idx if task.data.idx is not None else index}", "prompt": text,
                     "answer": getattr(task.data, "answer", None), "info": {"index": index}})
    return rows


def verifiers_episode(spec: str, args: dict[str, Any], base_url: str, row: dict[str, Any],
                      harness: str) -> dict[str, Any]:
    os.environ.setdefault("RLVR_HUB_API_KEY", "unused")  # the proxy needs none; the client wants one
    episode = v1_env(spec, args, harness).episode(row["info"]["index"], base_url)
    if episode.errors or not episode.traces:
        raise RuntimeError(f"the verifiers episode failed: {[e.message for e in episode.errors]}")
    trace = episode.traces[-1]
    reward = sum(r.score * r.weight for t in episode.traces for r in t.rewards.values() if r is not None)
    metrics = {k: float(v) for k, v in trace.metrics.items() if isinstance(v, int | float)}
    messages = [{"role": m.role, "content": _text(getattr(m, "content", None))} for m in trace.messages]
    return {"messages": messages, "reward": reward, "metrics": {**metrics, "turns": len(trace.calls)}}


# ---- the loop -----------------------------------------------------------------------------------------
def handle(request: dict[str, Any]) -> Any:
    op, hub = request["op"], request["hub"]
    spec, args = request["spec"], request.get("args") or {}
    for path in request.get("paths") or ():  # where the hub's environment modules live
        if path not in sys.path:
            sys.path.insert(0, path)
    if hub == "openenv" and op == "rows":
        return openenv_rows(spec, args, request["n"], request.get("seed", 0))
    if hub == "openenv" and op == "episode":
        return openenv_episode(spec, args, request["base_url"], request["row"], request.get("max_turns", 1),
                               request.get("action_field"), request.get("system_prompt"))
    if hub == "verifiers" and op == "rows":
        return verifiers_rows(spec, args, request["n"], request.get("harness", "null"))
    if hub == "verifiers" and op == "episode":
        return verifiers_episode(spec, args, request["base_url"], request["row"], request.get("harness", "null"))
    raise ValueError(f"unknown hub op {hub!r}/{op!r}")


def open_channel(fd: int) -> tuple[Any, Any]:
    """The channel's two directions as text files, kept from every program an episode starts; fd 1 and
    ``sys.stdout`` made the log's (stderr), so nothing printed, by Python or C or a child, is a reply."""
    os.set_inheritable(fd, False)  # pass_fds made it inheritable; episode programs must not get it
    sys.stdout.flush()
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    channel = socket.socket(fileno=fd)
    return channel.makefile("r", encoding="utf-8"), channel.makefile("w", encoding="utf-8")


def end_group() -> None:
    """The trainer is gone or done: end this worker's process group (the worker and every program its
    episodes started), when the group is its own (``HubWorker`` starts it in a session of its own)."""
    if os.getpgrp() == os.getpid():
        sys.stderr.flush()
        os.killpg(0, signal.SIGKILL)


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not argv[0].isdigit():
        print("usage: worker.py CHANNEL_FD (rlvr.envs.hubs.HubWorker starts it, with one end of a socket pair)",
              file=sys.stderr)
        return 2
    requests, replies = open_channel(int(argv[0]))
    out = threading.Lock()

    def answer(request: dict[str, Any]) -> None:
        try:
            reply = {"id": request.get("id"), "ok": True, "result": handle(request)}
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the caller, with its traceback
            reply = {"id": request.get("id"), "ok": False,
                     "error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"}
        with out:
            replies.write(json.dumps(reply, default=str) + "\n")
            replies.flush()

    for line in requests:
        if line.strip():
            threading.Thread(target=answer, args=(json.loads(line),), daemon=True).start()
    end_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
