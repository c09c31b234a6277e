"""Guess the sum again: a verifiers MultiTurnEnv that answers a wrong reply with feedback.

``env_response`` says "higher" or "lower" and counts its hints in the state; a ``@vf.stop``
condition ends the episode once the reply is right; ``max_turns`` caps it.
"""

import random

import verifiers as vf
from datasets import Dataset


class GuessEnv(vf.MultiTurnEnv):
    async def setup_state(self, state: vf.State) -> vf.State:
        state["hints"] = 0
        return state

    @vf.stop
    async def solved(self, state: vf.State) -> bool:
        if not state["trajectory"]:
            return False
        reply = self.parser.parse_answer(state["trajectory"][-1]["completion"])
        return reply == state["answer"]

    async def env_response(self, messages: vf.Messages, state: vf.State, **kwargs) -> vf.Messages:
        reply = self.parser.parse_answer(messages) or ""
        state["hints"] += 1
        hint = "higher" if reply.isdigit() and int(reply) < int(state["answer"]) else "lower"
        return [vf.UserMessage(content=hint)]


def load_environment(max_turns: int = 3, n: int = 2, seed: int = 0) -> vf.Environment:
    rows = [{"question": "3+4=", "answer": "7"}, {"question": "5+5=", "answer": "10"}]
    rng = random.Random(seed)
    for a, b in ((rng.randint(10, 99), rng.randint(10, 99)) for _ in range(max(0, n - len(rows)))):
        rows.append({"question": f"{a}+{b}=", "answer": str(a + b)})
    dataset = Dataset.from_list(rows[:n])
    parser = vf.Parser(extract_fn=lambda text: text.strip())

    def correct_answer(parser, completion, answer) -> float:
        return 1.0 if parser.parse_answer(completion) == answer else 0.0

    def hints(state) -> float:
        return float(state["hints"])

    rubric = vf.Rubric(funcs=[correct_answer], parser=parser)
    rubric.add_metric(hints)
    return GuessEnv(dataset=dataset, parser=parser, rubric=rubric, max_turns=max_turns)
