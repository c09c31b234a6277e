# A complete environment: a reward, and (optionally) a second try after a wrong answer.
from rlvr.envs.parsing import last_number
from rlvr.reward import Score


def reward_fn(messages, answer):
    got = last_number(messages[-1]["content"])
    if got is None:                                   # unparsable: reward 0, and say so in a metric
        return Score.of(0.0, parsed=0.0)
    return Score.of(float(got == str(answer)), parsed=1.0)


def interact(messages, state):                        # optional: makes the environment multi-turn
    wrong = reward_fn(messages, state["answer"]).value == 0
    return [{"role": "user", "content": "again"}] if wrong and state["turn"] < 2 else []
