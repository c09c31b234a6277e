"""An OpenEnv environment written with ``openenv-core``'s server-side API (``Environment``, ``Action``,
``Observation``, ``State``): sums of two numbers of exactly ``digits`` digits (one digit: 0-9).
``reset(seed)`` poses the sum in rlvr's own ``addition`` row number ``seed`` (task seed 0; the draw is
re-done here because the hubs' Python has no rlvr), so a run on it has a twin in
``examples/agent_addition.py``, the same tutor written as a plain agent: the same rows, split and warm
start. Each ``step`` reads the action's answer, ends the episode when it is right (reward 1, 0.5, 0.25
on the first, second, third try) or after three tries (reward 0), and otherwise says "Wrong, try
again.". The first observation carries the answer in its metadata, which rlvr's warm start reads.
Runs in the hubs' Python."""

from __future__ import annotations

import hashlib
import random
from typing import Any

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class AnswerAction(Action):
    answer: str


class TutorObservation(Observation):
    prompt: str


def row_rng(index: int) -> random.Random:
    """rlvr.seeding.rng_for(0, "arithmetic", index): the generator rlvr's ``addition`` row ``index`` draws from."""
    text = "\x1f".join(["0", repr("arithmetic"), repr(index)])
    return random.Random(int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") >> 1)


class AdditionTutor(Environment[AnswerAction, TutorObservation, State]):
    def __init__(self, tries: int = 3, digits: int = 1):
        super().__init__()
        self.tries, self.turn, self.answer, self.episode = tries, 0, "", None
        self.low, self.high = (0 if digits == 1 else 10 ** (digits - 1)), 10**digits - 1

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> TutorObservation:
        rng = row_rng(seed or 0)
        a, b = rng.randint(self.low, self.high), rng.randint(self.low, self.high)
        self.answer, self.turn, self.episode = str(a + b), 0, episode_id
        return TutorObservation(prompt=f"{a}+{b}=", metadata={"answer": self.answer})

    def step(self, action: AnswerAction, timeout_s: float | None = None, **kwargs: Any) -> TutorObservation:
        self.turn += 1
        if action.answer.strip() == self.answer:
            return TutorObservation(prompt="", done=True, reward=0.5 ** (self.turn - 1))
        if self.turn >= self.tries:
            return TutorObservation(prompt="", done=True, reward=0.0)
        return TutorObservation(prompt="Wrong, try again.", reward=0.0)

    @property
    def state(self) -> State:
        return State(episode_id=self.episode, step_count=self.turn)
