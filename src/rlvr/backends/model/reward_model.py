"""Reward models: a sequence-classification model scoring conversations, as a reward component.

Named in ``task.rewards`` as ``rm:SOURCE`` (a local folder or a hub name, loaded with
``AutoModelForSequenceClassification`` and ``AutoTokenizer``), with options after ``?``:
``rm:SOURCE?label=1&batch_size=16&max_wait_ms=5``. Like every entry of ``task.rewards`` it is a
component of the run's reward (weighted by ``task.reward_weights``) and recorded as
``reward/<name>``, the name being the source's last path part.

**The score** of a conversation: the model's single logit when it has one label
(``num_labels = 1``, a Bradley-Terry reward model or a regressor), else the softmax probability of
``label`` (required then: which class means "good" is the model's convention, not ours). The model
reads the conversation as its tokenizer's chat template renders it (no generation prompt), or, for a
tokenizer without one, the messages' contents joined by newlines. A conversation longer than the
model's context is refused (the sample's reward fails, naming it): never truncated silently.

**Batched on the policy's device**: one thread owns the model (on ``device``, the policy's) and
runs one padded forward pass per batch under ``torch.inference_mode``. Reward calls come from the
threads that score rows; each queues its conversation and waits, and a batch closes at
``batch_size`` conversations or ``max_wait_ms`` after its first, so rows scored at the same moment
share a forward pass. A forward pass that raises fails the calls of its batch, not the thread.

A backend module: imports torch and transformers.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from rlvr.backends.exit_wait import hold_exit
from rlvr.errors import ConfigError, RewardError
from rlvr.types import Message

RM_PREFIX = "rm:"
OPTIONS = {"label": int, "batch_size": int, "max_wait_ms": float}


def parse_rm_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``rm:SOURCE?key=value&...`` as (source, options); an unknown option or a bad value is a
    :class:`ConfigError` naming the spec."""
    body = spec.removeprefix(RM_PREFIX).strip()
    source, _, query = body.partition("?")
    if not source:
        raise ConfigError(f"task.rewards {spec!r}: name a reward model after 'rm:' (a folder or a hub name)")
    options: dict[str, Any] = {}
    for key, value in parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)) if query else ():
        if key not in OPTIONS:
            raise ConfigError(f"task.rewards {spec!r}: unknown option {key!r} (options: {sorted(OPTIONS)})")
        try:
            options[key] = OPTIONS[key](value)
        except ValueError:
            raise ConfigError(f"task.rewards {spec!r}: {key}={value!r} is not a {OPTIONS[key].__name__}") from None
    if options.get("batch_size", 1) < 1 or options.get("max_wait_ms", 0.0) < 0 or options.get("label", 0) < 0:
        raise ConfigError(f"task.rewards {spec!r}: batch_size must be >= 1, max_wait_ms and label >= 0")
    return source, options


def rm_name(source: str) -> str:
    """The component's name: the source's last path part (``org/sentiment-rm`` → ``sentiment-rm``)."""
    return Path(source.rstrip("/")).name or "rm"


def render_conversation(tokenizer: Any, messages: Sequence[Message]) -> str:
    """The text a reward model reads for ``messages``: its tokenizer's chat template (no generation
    prompt), else the contents joined by newlines. Training (:mod:`rlvr.backends.train.reward_model`)
    renders the same way, so a trained model scores the text it was trained on."""
    if getattr(tokenizer, "chat_template", None):
        return str(tokenizer.apply_chat_template([dict(m) for m in messages], tokenize=False))
    return "\n".join(str(m.get("content", "")) for m in messages)


@dataclass
class _Request:
    text: str
    done: threading.Event = field(default_factory=threading.Event)
    value: float | None = None
    error: BaseException | None = None


class RewardModel:
    """A sequence classifier behind ``reward_fn(messages)``; see the module docstring."""

    def __init__(self, source: str, device: str = "cpu", *, label: int | None = None, batch_size: int = 16,
                 max_wait_ms: float = 5.0):
        self.source, self.device, self.batch_size, self.max_wait_s = source, device, batch_size, max_wait_ms / 1000
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(source)
            self.model = AutoModelForSequenceClassification.from_pretrained(source)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"task.rewards 'rm:{source}': no sequence-classification model loads from it "
                              f"({str(exc).splitlines()[0]})") from None
        self.model.to(device).eval()
        n_labels = int(self.model.config.num_labels)
        if n_labels > 1 and label is None:
            raise ConfigError(f"task.rewards 'rm:{source}': the model has {n_labels} labels; say which one scores "
                              f"(rm:{source}?label=K, the reward being its probability)")
        if label is not None and not label < n_labels:
            raise ConfigError(f"task.rewards 'rm:{source}': label={label} but the model has {n_labels} label(s)")
        self.label = label if n_labels > 1 else None
        if self.tokenizer.pad_token is None:  # batches are padded; the model finds each row's last real token
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.context = int(getattr(self.model.config, "max_position_embeddings", 0) or 0)
        self.batches: list[int] = []  # each forward pass's size (for tests and the record)
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._thread = threading.Thread(target=self._serve, name=f"reward-model {rm_name(source)}", daemon=True)
        self._thread.start()
        hold_exit(self, self._thread, lambda rm: rm._queue.put(None))  # never left in a forward pass at exit

    # ---- the reward ----------------------------------------------------------------------------
    def reward_fn(self, messages: Sequence[Message], answer: Any = None) -> float:
        """The model's score of the conversation (``answer`` is not read: the model is the judge)."""
        request = _Request(self.render(messages))
        self._queue.put(request)
        request.done.wait()
        if request.error is not None:
            raise request.error
        return float(request.value)  # type: ignore[arg-type]

    reward_fn.needs_answer = False  # type: ignore[attr-defined]

    def render(self, messages: Sequence[Message]) -> str:
        return render_conversation(self.tokenizer, messages)

    def score_texts(self, texts: Sequence[str]) -> list[float]:
        """One padded forward pass over ``texts`` (in this thread): their scores, in order."""
        enc = self.tokenizer(list(texts), return_tensors="pt", padding=True, add_special_tokens=False)
        lengths = enc["attention_mask"].sum(-1).tolist()
        too_long = [n for n in lengths if self.context and n > self.context]
        if too_long:
            raise RewardError(f"reward model {self.source!r}: a conversation of {too_long[0]} tokens exceeds its "
                              f"context of {self.context} (never truncated)")
        with torch.inference_mode():
            logits = self.model(**{k: v.to(self.device) for k, v in enc.items()}).logits.float()
        scores = logits[:, 0] if self.label is None else logits.softmax(-1)[:, self.label]
        return scores.cpu().tolist()

    # ---- the batching thread ---------------------------------------------------------------------
    def _serve(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            deadline = time.monotonic() + self.max_wait_s
            while len(batch) < self.batch_size:
                try:
                    more = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if more is None:
                    self._queue.put(None)  # stop after this batch
                    break
                batch.append(more)
            self._run(batch)

    def _run(self, batch: list[_Request]) -> None:
        try:
            values = self.score_texts([r.text for r in batch])
            self.batches.append(len(batch))
        except BaseException as exc:  # noqa: BLE001 - handed to every caller of this batch
            for r in batch:
                r.error = exc
        else:
            for r, v in zip(batch, values, strict=True):
                r.value = v
        for r in batch:
            r.done.set()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)

    def describe(self) -> dict[str, Any]:
        return {"type": "reward model", "source": self.source, "device": self.device, "label": self.label,
                "batch_size": self.batch_size, "max_wait_ms": self.max_wait_s * 1000}
