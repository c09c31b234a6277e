"""An OpenEnv environment written with ``openenv-core``'s server-side API (``Environment``, ``Action``,
``Observation``, ``State``): one-digit sums. ``reset(seed)`` poses one; each ``step`` reads the
action's answer, ends the episode when it is right (reward 1, 0.5, 0.25 on the first, second, third
try) or after three tries (reward 0), and otherwise says "Wrong, try again.". The first observation
carries the answer in its metadata, which rlvr's warm start reads. Runs in the hubs' Python."""

from __future__ import annotations

import random
from typing import Any

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class AnswerAction(Action):
    answer: str


class TutorObservation(Observation):
    prompt: str


class AdditionTutor(Environment[AnswerAction, TutorObservation, State]):
    def __init__(self, tries: int = 3):
        super().__init__()
        self.tries, self.turn, self.answer, self.episode = tries, 0, "", None

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> TutorObservation:
        rng = random.Random(seed)
        a, b = rng.randint(0, 9), rng.randint(0, 9)
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
