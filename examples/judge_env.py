"""An LLM judge as a reward: an OpenAI-compatible server (rlvr serve, vLLM) grades each reply.

The judge sees the question, the reference answer and the reply, and the reward is the judge's
probability of " yes" against " no" as the next words: both endings go out in one
``POST /v1/completions`` with ``prompt_logprobs=0`` (two prompts, one token generated, greedy),
and each ending's log-probability is the sum over its own tokens (the tokens after the prefix the
two prompts share). That works with any tokenizer and needs no sampling, so a judge is
deterministic. The judge's log-probs are recorded beside the reward (``judge_yes``, ``judge_no``).

A judge call is slow and may hang, so run it in reward workers (``[task] reward_workers = N``):
each call is bounded by ``loop.reward_timeout_s`` there, and the HTTP call itself by ``timeout_s``.
A judge that cannot be reached raises, which the loop counts (``on_sample_error = "drop"``) or
stops on, naming the row. Configure it with ``env_args`` (see examples/judge.toml)::

    env = "examples/judge_env.py"
    env_args = { judge_url = "http://127.0.0.1:8011/v1", judge_model = "judge", timeout_s = 10.0 }

Standard library only (``urllib``), so a worker loads it in a blink.
"""

from __future__ import annotations

import json
import math
import os
import urllib.error
import urllib.request

from rlvr.reward import Score

TEMPLATE = "Q: {question}\nRef: {answer}\nReply: {reply}\nCorrect?"


class Judge:
    """``reward_fn(messages, answer)``: the judge's p(" yes") for the last reply, as a Score."""

    name = "llm_judge"

    def __init__(self, judge_url: str, judge_model: str = "judge", timeout_s: float = 10.0, max_chars: int = 200):
        self.url = judge_url.rstrip("/").removesuffix("/v1") + "/v1/completions"
        self.model, self.timeout_s, self.max_chars = judge_model, timeout_s, max_chars
        self.headers = {"Content-Type": "application/json"}
        if os.environ.get("RLVR_API_KEY"):
            self.headers["Authorization"] = f"Bearer {os.environ['RLVR_API_KEY']}"

    def reward_fn(self, messages, answer):
        question = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
        reply = messages[-1]["content"] if messages and messages[-1]["role"] == "assistant" else ""
        prompt = TEMPLATE.format(question=question[-self.max_chars:], answer=str(answer)[:self.max_chars],
                                 reply=reply[:self.max_chars])
        yes, no = self.ending_logprobs(prompt, (" yes", " no"))
        p_yes = 1.0 / (1.0 + math.exp(no - yes))
        return Score.of(p_yes, judge_yes=yes, judge_no=no)

    def ending_logprobs(self, prompt, endings):
        """log p(ending | prompt) for each ending, from the judge's prompt log-probs."""
        body = {"model": self.model, "prompt": [prompt + e for e in endings], "max_tokens": 1, "temperature": 0,
                "prompt_logprobs": 0}
        request = urllib.request.Request(self.url, json.dumps(body).encode(), self.headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                data = json.load(response)
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise RuntimeError(f"judge {self.url} (model {self.model!r}) did not answer within "
                               f"{self.timeout_s:g}s: {exc}") from None
        per_prompt = [[_entry(e) for e in choice["prompt_logprobs"][1:]]
                      for choice in sorted(data["choices"], key=lambda c: c["index"])]
        shared = 0  # the tokens every prompt has in common: the question, not an ending
        while all(shared < len(p) for p in per_prompt) and len({p[shared][0] for p in per_prompt}) == 1:
            shared += 1
        return [math.fsum(lp for _, lp in p[shared:]) for p in per_prompt]


def _entry(entry):
    """``(token id, log-prob)`` of one prompt position (``{"<id>": {"logprob": ...}}``)."""
    (token, info), = entry.items()
    return int(token), float(info["logprob"])


def load_environment(judge_url: str, judge_model: str = "judge", timeout_s: float = 10.0) -> Judge:
    return Judge(judge_url, judge_model, timeout_s)
