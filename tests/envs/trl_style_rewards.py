"""Reward functions written for TRL's GRPOTrainer, as its users write them; used unchanged by the tests."""


def accuracy_reward(completions, solution, **kwargs):
    """Conversational data: each completion is a list of messages; 1.0 when the reply equals the solution."""
    contents = [completion[0]["content"] for completion in completions]
    return [1.0 if c.strip() == s.strip() else 0.0 for c, s in zip(contents, solution, strict=True)]


def short_reward(completions, **kwargs):
    """Standard data: each completion is a string; shorter is better, None for an empty reply."""
    return [None if not c else -len(c) / 10 for c in completions]


def digits_reward(prompts, completions, **kwargs):
    """Either format; rewards a reply made of digits only."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [1.0 if t.strip().isdigit() else 0.0 for t in texts]
