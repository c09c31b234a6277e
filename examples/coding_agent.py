"""A coding agent for ``[task] agent`` (docs/agents.md, docs/environments.md#coding): it runs the
repository's tests in the sandbox, opens the module that defines the first failing test's function,
and asks the model, through the plain ``openai`` client, for an edit (``calc.py:2:    return a + b``).
It returns the model's reply; the environment (``task.env = "coding"``) applies it to a copy of the
repository in the sandbox and pays 1 when every test passes. See examples/coding_agent.toml."""

from __future__ import annotations

import threading

from openai import OpenAI

from rlvr.envs.coding import TestRunner, agent_view

_lock = threading.Lock()
_runner: TestRunner | None = None


def runner() -> TestRunner:
    """One per process: its cache keeps each repository's first test run, which every sample of the
    task (and every later step) shares."""
    global _runner
    with _lock:
        if _runner is None:
            _runner = TestRunner()
        return _runner


def run(base_url: str, row: dict) -> dict:
    files, tests = row["info"]["files"], row["info"]["tests"]
    prompt, report = agent_view(runner(), files, tests)
    if report.error is not None:  # the sandbox stopped the run (a loaded host's wall clock): not cached, try again
        prompt, report = agent_view(runner(), files, tests)
    if prompt is None:  # nothing fails, or the failure names no function: no model call to make
        raise RuntimeError(f"row {row['id']}: no failing test to fix ({report.total} tests, {len(report.failed)} "
                           f"failed; sandbox: {report.error or 'ran'})")
    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    reply = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": prompt}])
    return {"answer": reply.choices[0].message.content or "", "metrics": {"tests_seen": float(report.total)}}
