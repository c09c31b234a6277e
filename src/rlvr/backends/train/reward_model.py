"""Reward-model training: a sequence classifier fitted to preference pairs with the Bradley-Terry
loss, exported as a transformers folder that ``rm:FOLDER`` in ``task.rewards`` scores with.

**Pairs** (:func:`read_pairs`): JSONL, one ``{"prompt"?, "chosen", "rejected"}`` per line, TRL's
preference format. Each of the three is a string or a list of chat messages; a string prompt is the
user's turn and a string answer the assistant's. The conversation scored is prompt + answer, rendered
exactly as :class:`~rlvr.backends.model.reward_model.RewardModel` renders it at reward time
(:func:`~rlvr.backends.model.reward_model.render_conversation`: the tokenizer's chat template, else
the contents joined by newlines), so the model is trained on the text it will be asked to score. A
malformed line is a :class:`~rlvr.errors.DataError` naming the file, line and field; a pair longer
than the model's context is refused naming its line, never truncated (the reward model refuses it
too).

**Training**: ``AutoModelForSequenceClassification`` with one label over ``base`` (a causal LM
folder gets a new linear score head on its last real token, the classifier transformers builds);
every weight trained, AdamW, ``loss = -log sigmoid(r(chosen) - r(rejected))`` averaged over a batch,
chosen and rejected of a batch in one padded forward pass. A seeded split holds out
``heldout_frac`` of the pairs: their accuracy (the fraction ranked the right way) and mean margin
are measured before and after, and written with the training's own figures to
``OUT/rm_train.json``.

**Export**: ``save_pretrained`` of the model (``num_labels = 1``, ``pad_token_id`` set) and the
tokenizer into ``OUT``; ``AutoModelForSequenceClassification.from_pretrained(OUT)`` loads it, and
``task.rewards = ["rm:OUT"]`` uses its single logit as the reward.

A backend module: imports torch and transformers.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from rlvr.backends.model.reward_model import render_conversation
from rlvr.errors import ConfigError, DataError
from rlvr.seeding import derive_seed

REPORT = "rm_train.json"


@dataclass(frozen=True)
class Pair:
    """One preference: the conversation ending in ``chosen`` beats the one ending in ``rejected``."""

    chosen: list[dict[str, Any]]
    rejected: list[dict[str, Any]]
    line: int | None = None


def _messages(value: Any, role: str, where: str, field: str) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if isinstance(value, list) and value and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                                 and isinstance(m.get("content"), str) for m in value):
        return [dict(m) for m in value]
    raise DataError(f"{where}: {field!r} must be a string or a non-empty list of {{'role', 'content'}} messages")


def as_pair(row: Any, where: str, line: int | None = None) -> Pair:
    """A :class:`Pair` from one ``{"prompt"?, "chosen", "rejected"}`` row."""
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected an object with 'chosen' and 'rejected'")
    for field in ("chosen", "rejected"):
        if field not in row:
            raise DataError(f"{where}: no {field!r} field (preference pairs are {{'prompt'?, 'chosen', 'rejected'}})")
    prompt = _messages(row["prompt"], "user", where, "prompt") if row.get("prompt") is not None else []
    chosen = prompt + _messages(row["chosen"], "assistant", where, "chosen")
    rejected = prompt + _messages(row["rejected"], "assistant", where, "rejected")
    if chosen == rejected:
        raise DataError(f"{where}: 'chosen' and 'rejected' are the same conversation")
    return Pair(chosen, rejected, line)


def read_pairs(source: str | Path | Iterable[dict[str, Any]]) -> list[Pair]:
    """The pairs of a JSONL file, or of an iterable of rows; see the module docstring."""
    if not isinstance(source, str | Path):
        return [as_pair(row, f"pair {i}", i) for i, row in enumerate(source)]
    path = Path(source)
    if not path.is_file():
        raise DataError(f"preference pairs {path}: no such file")
    pairs = []
    with path.open(encoding="utf-8") as f:
        for lineno, text in enumerate(f, 1):
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except ValueError as exc:
                raise DataError(f"preference pairs {path} line {lineno}: invalid JSON ({exc})") from None
            pairs.append(as_pair(row, f"preference pairs {path} line {lineno}", lineno))
    if len(pairs) < 2:
        raise DataError(f"preference pairs {path}: {len(pairs)} pair(s); training needs at least 2")
    return pairs


def split_pairs(pairs: Sequence[Pair], heldout_frac: float, seed: int) -> tuple[list[Pair], list[Pair]]:
    """(train, held-out): a seeded shuffle, ``heldout_frac`` of the pairs held out (at least one
    when the fraction is positive, never all)."""
    if not 0 <= heldout_frac < 1:
        raise ConfigError(f"heldout_frac={heldout_frac}: a fraction in [0, 1)")
    order = list(range(len(pairs)))
    random.Random(derive_seed(seed, "rm", "split")).shuffle(order)
    n_held = min(len(pairs) - 1, max(1, round(heldout_frac * len(pairs)))) if heldout_frac else 0
    held = set(order[:n_held])
    return [p for i, p in enumerate(pairs) if i not in held], [p for i, p in enumerate(pairs) if i in held]


class PairScorer:
    """A sequence classifier and its tokenizer, scoring rendered conversations in padded batches."""

    def __init__(self, source: str | Path, device: str = "cpu"):
        self.source, self.device = str(source), device
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(self.source)
            self.model = AutoModelForSequenceClassification.from_pretrained(self.source, num_labels=1,
                                                                            dtype=torch.float32)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"reward model base {self.source!r}: no sequence classifier loads from it "
                              f"({str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__})"
                              ) from None
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model.config.pad_token_id = self.tokenizer.pad_token_id  # the head reads each row's last real token
        self.model.to(device)
        self.context = int(getattr(self.model.config, "max_position_embeddings", 0) or 0)

    def render(self, messages: list[dict[str, Any]]) -> str:
        return render_conversation(self.tokenizer, messages)

    def check_lengths(self, pairs: Sequence[Pair]) -> None:
        """Refuse, naming the line, a pair the model could not read whole."""
        for pair in pairs:
            for side in ("chosen", "rejected"):
                n = len(self.tokenizer(self.render(getattr(pair, side)), add_special_tokens=False)["input_ids"])
                if self.context and n > self.context:
                    raise DataError(f"preference pair at line {pair.line}: {side} is {n} tokens, over the model's "
                                    f"context of {self.context} (never truncated: shorten or drop it)")

    def scores(self, texts: Sequence[str]) -> torch.Tensor:
        enc = self.tokenizer(list(texts), return_tensors="pt", padding=True, add_special_tokens=False)
        return self.model(**{k: v.to(self.device) for k, v in enc.items()}).logits[:, 0].float()

    def margins(self, pairs: Sequence[Pair], batch_size: int) -> torch.Tensor:
        """``r(chosen) - r(rejected)`` per pair, without gradients."""
        was_training = self.model.training
        self.model.eval()
        out = []
        with torch.inference_mode():
            for start in range(0, len(pairs), batch_size):
                out.append(self._margin(pairs[start:start + batch_size]))
        self.model.train(was_training)
        return torch.cat(out) if out else torch.empty(0)

    def _margin(self, batch: Sequence[Pair]) -> torch.Tensor:
        scores = self.scores([self.render(p.chosen) for p in batch] + [self.render(p.rejected) for p in batch])
        return scores[:len(batch)] - scores[len(batch):]


def ranking(margins: torch.Tensor) -> dict[str, float]:
    """Accuracy (pairs ranked the right way; a tie counts half) and the mean margin."""
    if not len(margins):
        return {"accuracy": math.nan, "mean_margin": math.nan, "pairs": 0}
    accuracy = ((margins > 0).float() + 0.5 * (margins == 0).float()).mean().item()
    return {"accuracy": accuracy, "mean_margin": margins.mean().item(), "pairs": len(margins)}


def train_reward_model(base: str | Path, pairs: Sequence[Pair], out: str | Path, *, epochs: int = 1,
                       lr: float = 1e-5, batch_size: int = 8, heldout_frac: float = 0.1, seed: int = 0,
                       device: str = "cpu", log: Any = print) -> dict[str, Any]:
    """Train, export to ``out`` and return the report (also written to ``out/rm_train.json``)."""
    if epochs < 1 or batch_size < 1 or not lr > 0:
        raise ConfigError(f"epochs={epochs}, batch_size={batch_size}, lr={lr}: need epochs >= 1, batch_size >= 1, "
                          "lr > 0")
    torch.manual_seed(derive_seed(seed, "rm", "init"))  # the new score head's initial weights
    scorer = PairScorer(base, device)
    scorer.check_lengths(pairs)
    train, held = split_pairs(pairs, heldout_frac, seed)
    before = ranking(scorer.margins(held, batch_size))
    optimizer = torch.optim.AdamW(scorer.model.parameters(), lr=lr)
    scorer.model.train()
    rng, losses, start = random.Random(derive_seed(seed, "rm", "order")), [], time.perf_counter()
    for epoch in range(epochs):
        order = list(range(len(train)))
        rng.shuffle(order)
        for step in range(0, len(order), batch_size):
            batch = [train[i] for i in order[step:step + batch_size]]
            loss = -torch.nn.functional.logsigmoid(scorer._margin(batch)).mean()  # Bradley-Terry
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        log(f"rm: epoch {epoch + 1}/{epochs}: mean loss {sum(losses[-len(order):]) / max(1, len(order)):.4f}")
    after = ranking(scorer.margins(held, batch_size))
    report = {"base": str(base), "pairs": len(pairs), "train_pairs": len(train), "heldout_pairs": len(held),
              "epochs": epochs, "lr": lr, "batch_size": batch_size, "seed": seed, "steps": len(losses),
              "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
              "seconds": time.perf_counter() - start, "heldout_before": before, "heldout_after": after}
    export(scorer, out, report)
    return report


def export(scorer: PairScorer, out: str | Path, report: dict[str, Any]) -> Path:
    """The classifier and tokenizer as a transformers folder, with the training report beside them."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    scorer.model.eval()
    scorer.model.config.id2label, scorer.model.config.label2id = {0: "reward"}, {"reward": 0}
    scorer.model.save_pretrained(folder)
    scorer.tokenizer.save_pretrained(folder)
    (folder / REPORT).write_text(json.dumps(report, indent=2, allow_nan=True) + "\n")
    return folder
