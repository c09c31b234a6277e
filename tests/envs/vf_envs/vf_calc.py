"""A verifiers ToolEnv: the model may call ``add`` before it answers."""

import verifiers as vf
from datasets import Dataset


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


def load_environment() -> vf.Environment:
    dataset = Dataset.from_list([{"question": "412+37=", "answer": "449"}])
    parser = vf.Parser(extract_fn=lambda text: text.strip())

    def correct_answer(parser, completion, answer) -> float:
        return 1.0 if parser.parse_answer(completion) == answer else 0.0

    rubric = vf.Rubric(funcs=[correct_answer], parser=parser)
    return vf.ToolEnv(dataset=dataset, tools=[add], parser=parser, rubric=rubric, max_turns=4)
