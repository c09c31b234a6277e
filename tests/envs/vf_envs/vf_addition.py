"""Two-digit addition as a verifiers SingleTurnEnv, written with verifiers' documented API only.

The dataset is built lazily (a builder function, as verifiers' own environments do), the reply
is read by a Parser and paid by a Rubric; ``builds`` counts the dataset builds so a test can see
that loading the environment did not build it.
"""

import random

import verifiers as vf
from datasets import Dataset

builds = []


def load_environment(n: int = 400, digits: int = 2, seed: int = 0) -> vf.Environment:
    def build_dataset() -> Dataset:
        builds.append(n)
        rng = random.Random(seed)
        low, high = 10 ** (digits - 1), 10 ** digits - 1
        rows = []
        for _ in range(n):
            a, b = rng.randint(low, high), rng.randint(low, high)
            rows.append({"question": f"{a}+{b}=", "answer": str(a + b), "info": {"a": a, "b": b}})
        return Dataset.from_list(rows)

    parser = vf.Parser(extract_fn=lambda text: text.strip())

    def correct_answer(parser, completion, answer) -> float:
        return 1.0 if parser.parse_answer(completion) == answer else 0.0

    def is_number(parser, completion) -> float:
        return 1.0 if (parser.parse_answer(completion) or "").isdigit() else 0.0

    def operands_seen(info, question) -> float:  # reads the row's info and another column
        return 1.0 if question == f"{info['a']}+{info['b']}=" else 0.0

    rubric = vf.Rubric(funcs=[correct_answer], weights=[1.0], parser=parser)
    rubric.add_metric(is_number)
    rubric.add_metric(operands_seen)
    return vf.SingleTurnEnv(dataset=build_dataset, parser=parser, rubric=rubric)
