"""Dense retrieval for the local search service: an embedding model and an exact cosine index.

- :class:`Embedder`: any transformers model folder (or hub name already in the local cache) loaded
  with ``AutoModel``; a text's embedding is the mean of the last hidden states over its real tokens
  (the attention mask: padding never counts), L2-normalised, in float32. Texts longer than the
  model's context are truncated to it (``max_length``), the one place text is cut: an embedding
  model reads a bounded window, as every dense retriever does.
- :class:`DenseIndex`: the corpus embedded once at start-up, held as one ``N x D`` matrix; a query
  is embedded and scored against every passage by a dot product (= cosine, both sides being unit
  vectors); the ``k`` best come back as ``{"id", "text", "score"}``, best first (equal scores
  among them in corpus order), the same shape :class:`~rlvr.envs.services.search.BM25Index` answers.

Where exact search stops scaling: memory is ``N * D * 4`` bytes (a million 768-dimension passages:
3 GB) and each query reads all of it: measured on one thread of a busy 2-core machine, 85 ms per
query at 100,000 x 768 (so about a second at a million). Up to some hundred thousand passages that
is fine for a training run's search calls; beyond, put an approximate index (FAISS, a vector
database) behind ``service_url`` instead. Embedding the corpus is the other
cost: one forward pass per passage at start-up, on ``device``.

Queries from the service's threads are serialised through one lock: the model is shared, and one
forward pass at a time bounds memory.

An environment module: imports torch and transformers.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModel, AutoTokenizer

from rlvr.envs.services.corpus import Passage, as_passage
from rlvr.errors import ConfigError

DEFAULT_MAX_LENGTH = 512


class Embedder:
    """Mean-pooled, L2-normalised embeddings from a transformers model (``source``: a folder)."""

    def __init__(self, source: str | Path, *, device: str = "cpu", batch_size: int = 32,
                 max_length: int | None = None) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"Embedder: batch_size must be an integer >= 1, got {batch_size!r}")
        self.source, self.device, self.batch_size = str(source), device, batch_size
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(self.source)
            self.model = AutoModel.from_pretrained(self.source, dtype=torch.float32)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"embedding_model {self.source!r}: no transformers model and tokenizer load from it "
                              f"({str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__})"
                              ) from None
        self.model.to(device).eval()
        if self.tokenizer.pad_token is None:  # batches are padded; the mask keeps padding out of the mean
            self.tokenizer.pad_token = self.tokenizer.eos_token or self.tokenizer.unk_token
        context = int(getattr(self.model.config, "max_position_embeddings", 0) or DEFAULT_MAX_LENGTH)
        self.max_length = min(max_length or context, context)
        self._lock = threading.Lock()

    @property
    def dim(self) -> int:
        return int(self.model.config.hidden_size)

    def embed(self, texts: Sequence[str]) -> torch.Tensor:
        """``len(texts) x dim`` unit vectors (float32, on the CPU), in batches of ``batch_size``."""
        out = []
        with self._lock, torch.inference_mode():
            for start in range(0, len(texts), self.batch_size):
                chunk = [str(t) for t in texts[start:start + self.batch_size]]
                enc = self.tokenizer(chunk, return_tensors="pt", padding=True, truncation=True,
                                     max_length=self.max_length)
                enc = {k: v.to(self.device) for k, v in enc.items() if k in ("input_ids", "attention_mask")}
                hidden = self.model(**enc).last_hidden_state.float()
                mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
                out.append(torch.nn.functional.normalize(pooled, dim=-1).cpu())
        return torch.cat(out) if out else torch.empty(0, self.dim)

    def describe(self) -> dict[str, Any]:
        return {"embedding_model": self.source, "dim": self.dim, "max_length": self.max_length,
                "pooling": "mean", "device": self.device}


class DenseIndex:
    """Exact cosine search over passages embedded by ``embedder`` (an :class:`Embedder`, or a model
    folder to build one from); see the module docstring for where it stops scaling."""

    def __init__(self, passages: Iterable[Passage | Mapping[str, Any] | tuple[str, str]],
                 embedder: Embedder | str | Path, **embedder_options: Any) -> None:
        self.embedder = embedder if isinstance(embedder, Embedder) else Embedder(embedder, **embedder_options)
        self.passages: list[Passage] = [as_passage(p, "DenseIndex") for p in passages]
        self.matrix = self.embedder.embed([p.text for p in self.passages])

    def __len__(self) -> int:
        return len(self.passages)

    def scores(self, query: str) -> torch.Tensor:
        """The cosine similarity of ``query`` to every passage, in corpus order."""
        return self.matrix @ self.embedder.embed([query])[0]

    def search(self, query: str, k: int = 3) -> list[dict[str, Any]]:
        """The ``k`` most similar passages as ``{"id", "text", "score"}``, best first (ties: corpus order)."""
        if not self.passages or k <= 0:
            return []
        scores = self.scores(query)
        top = torch.topk(scores, min(k, len(self.passages))).indices.tolist()  # not a full sort of the corpus
        values = scores.tolist()
        best = sorted(top, key=lambda i: (-values[i], i))
        return [{"id": self.passages[i].id, "text": self.passages[i].text, "score": values[i]} for i in best]

    def describe(self) -> dict[str, Any]:
        return {"retriever": "dense", "passages": len(self), **self.embedder.describe()}
