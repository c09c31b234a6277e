"""Rows and reward for ``bench/gpu_compare.py``: a task whose reward has variance on random weights.

A random-weight model never learns to answer anything in a few steps, and almost never emits an end
token, so every completion runs to its budget; a benchmark of the step's cost still needs groups
whose rewards differ (GRPO skips nothing, but a zero-variance group would train on zero advantages,
which some libraries short-cut). Reward: 1 when the reply has an even number of characters, else 0:
random text gives each completion an even chance, so a group of 8 almost always has both.

Rows: "Write a short note about TOPIC (note N)." for ``n`` distinct N, topics in a seeded order, so
prompts are chat-rendered to a few dozen tokens of similar length, as real instructions are.
"""

import random

from rlvr.reward import Score

TOPICS = ("rivers", "bridges", "tea", "owls", "trains", "maps", "clocks", "bees", "glass", "salt", "kites", "wool")


def make_rows(n, *, seed):
    rng = random.Random(seed)
    return [{"prompt": f"Write a short note about {rng.choice(TOPICS)} (note {i}).", "answer": "even"}
            for i in range(n)]


def reward_fn(messages, answer):
    reply = messages[-1]["content"]
    return Score.of(float(len(reply) % 2 == 0), chars=float(len(reply)))
