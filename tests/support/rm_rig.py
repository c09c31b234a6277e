"""A reward model for the tests: the tiny classifier, trained for a few seconds to score how much of
a conversation is the character '7' (its score: the fraction of 7s among the conversation's
characters, regressed with one logit). Kept small so the fast tests and the slow learning run share
one recipe."""

from __future__ import annotations

import random
import string
from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from rlvr.backends.model.tiny import build_tiny_classifier


def sevens(text: str) -> float:
    """The property the classifier learns: the share of '7' among the conversation's characters."""
    return text.count("7") / max(1, len(text))


def conversation(rng: random.Random) -> list[dict]:
    a, b = rng.randrange(100), rng.randrange(100)
    alphabet = rng.choice(["0123456789", "0123456789777777", string.printable[:94]])  # digits, 7-heavy, anything
    reply = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 9)))
    return [{"role": "user", "content": f"{a}+{b}="}, {"role": "assistant", "content": reply}]


def train_sevens_rm(out: Path, steps: int = 300, seed: int = 0) -> Path:
    """Build the tiny classifier in ``out`` and fit it to :func:`sevens` (MSE, Adam); saved in place."""
    build_tiny_classifier(out, hidden=32, layers=1, heads=2, num_labels=1, seed=seed)
    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForSequenceClassification.from_pretrained(out)
    rng = random.Random(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for _ in range(steps):
            convs = [conversation(rng) for _ in range(32)]
            texts = [tokenizer.apply_chat_template(c, tokenize=False) for c in convs]
            target = torch.tensor([sevens(c[0]["content"] + c[1]["content"]) for c in convs])
            enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            loss = torch.nn.functional.mse_loss(model(**enc).logits[:, 0], target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.save_pretrained(out)
    return out
