"""The hub worker: run in the hub environments' own Python (``.venv-hubs``, ``make hubs``), it loads a
hub environment and plays its episodes against a base URL (the recording proxy's, one per episode).

It speaks JSON lines on stdin/stdout: a request ``{"id", "op", ...}`` is answered by ``{"id", "ok":
true, "result"}`` or ``{"id", "ok": false, "error"}``; requests run concurrently, one thread each.
Ops: ``rows`` (the hub's tasks as rlvr rows) and ``episode`` (one episode of a row against
``base_url``: the conversation, the hub's reward and metrics). This file imports nothing of rlvr:
the hub's Python has its own packages (verifiers 0.4 pins ``openai<3``), not rlvr's.

Hubs:
- ``openenv``: an OpenEnv ``Environment`` subclass (``package.module:Class``), instantiated per
  episode with ``args``. A row is a reset seed; its prompt is the first observation's text. Each
  model reply becomes the action (the action class's one text field, or ``action_field``); each
  observation's text the next user message, until ``done`` or ``max_turns``. The reward is the sum
  of the observations' rewards.
- ``verifiers``: a verifiers 0.4 ``v1`` environment (see :func:`verifiers_rows`).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import sys
import threading
import traceback
import typing
from typing import Any

TEXT_FIELDS = ("prompt", "text", "message", "content", "observation", "question")


# ---- OpenEnv ------------------------------------------------------------------------------------------
def load_object(spec: str) -> Any:
    """``package.module:attr`` or ``path/file.py:attr``."""
    module, _, attr = spec.rpartition(":") if spec.count(":") > 1 or spec.split(":")[0].endswith(".py") \
        else spec.partition(":")
    if module.endswith(".py"):
        loaded = importlib.util.spec_from_file_location(f"rlvr_hub_{abs(hash(module))}", module)
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
    messages = ([{"role": "system", "content": system_prompt}] if system_prompt else [])
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
def verifiers_rows(spec: str, args: dict[str, Any], n: int, seed: int) -> list[dict[str, Any]]:
    raise NotImplementedError("verifiers v1 tasksets are not run by this worker (see docs/agents.md)")


# ---- the loop -----------------------------------------------------------------------------------------
def handle(request: dict[str, Any]) -> Any:
    op, hub = request["op"], request["hub"]
    spec, args = request["spec"], request.get("args") or {}
    if hub == "openenv" and op == "rows":
        return openenv_rows(spec, args, request["n"], request.get("seed", 0))
    if hub == "openenv" and op == "episode":
        return openenv_episode(spec, args, request["base_url"], request["row"], request.get("max_turns", 1),
                               request.get("action_field"), request.get("system_prompt"))
    if hub == "verifiers" and op == "rows":
        return verifiers_rows(spec, args, request["n"], request.get("seed", 0))
    raise ValueError(f"unknown hub op {hub!r}/{op!r}")


def main() -> int:
    out = threading.Lock()

    def answer(request: dict[str, Any]) -> None:
        try:
            reply = {"id": request.get("id"), "ok": True, "result": handle(request)}
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the caller, with its traceback
            reply = {"id": request.get("id"), "ok": False,
                     "error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"}
        with out:
            sys.stdout.write(json.dumps(reply, default=str) + "\n")
            sys.stdout.flush()

    for line in sys.stdin:
        if line.strip():
            threading.Thread(target=answer, args=(json.loads(line),), daemon=True).start()
    return 0


if __name__ == "__main__":
    sys.exit(main())
