"""An agent program for ``[task] agent``, written against the plain ``openai`` client and nothing of
rlvr: a tutor that asks the model the row's question and, while the answer is wrong, says so and
asks again in the same chat, up to three tries. It returns its own score (1 for a first-try
answer, 0.5 for a second, 0.25 for a third, 0 otherwise) with the final answer; the episode's
model calls (one to three) are recorded by the proxy and trained on as one segment. See
examples/agent_addition.toml and docs/agents.md."""

from __future__ import annotations

from openai import OpenAI

TRIES = 3


def run(base_url: str, row: dict) -> dict:
    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": row["prompt"]}]
    answer = ""
    for attempt in range(TRIES):
        reply = client.chat.completions.create(model="policy", messages=messages)
        answer = reply.choices[0].message.content or ""
        if answer.strip() == str(row["answer"]):
            return {"answer": answer, "reward": 0.5 ** attempt, "metrics": {"tries": attempt + 1}}
        # The reply goes back as it came, so the next call's prompt extends this one token by token.
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "Wrong, try again."}]
    return {"answer": answer, "reward": 0.0, "metrics": {"tries": TRIES}}
