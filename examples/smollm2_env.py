# Small arithmetic asked the way an instruct model is asked, for examples/smollm2.toml.
#
# Rows: "What is 7 - 3? Reply with only the number." over every pair of operands in [low, high] and
# every operator in `ops` (subtraction kept non-negative), each expression once, in a seeded order.
# Reward: 1 when the last number in the reply is the answer ("7 - 3 = 4" counts, as a person
# grading it would count it). The `terse` metric says whether the reply was the number alone, as
# asked: the record shows the model learning the format as well as the sums.
import random

from rlvr.envs.parsing import last_number
from rlvr.reward import Score

OPERATIONS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def make_rows(n, *, seed, ops="+-*", low=1, high=9):
    if any(op not in OPERATIONS for op in ops) or not ops:
        raise ValueError(f"ops must be a non-empty string of {''.join(OPERATIONS)}, got {ops!r}")
    pairs = [(a, op, b) for op in ops for a in range(low, high + 1) for b in range(low, high + 1)
             if op != "-" or a >= b]
    if n > len(pairs):
        raise ValueError(f"only {len(pairs)} distinct expressions with ops={ops!r} in [{low}, {high}]; n={n}")
    random.Random(seed).shuffle(pairs)
    return [{"prompt": f"What is {a} {op} {b}? Reply with only the number.",
             "answer": str(OPERATIONS[op](a, b)), "info": {"op": op}}
            for a, op, b in pairs[:n]]


def reward_fn(messages, answer):
    reply = messages[-1]["content"]
    got = last_number(reply)
    return Score.of(float(got == str(answer)), parsed=float(got is not None),
                    terse=float(reply.strip() == str(answer)))
