"""A retrieval environment: the model searches a local corpus, reads passages, and answers.

The model writes ``<search>query</search>``; ``interact`` sends the query to a search service
and answers ``{"role": "tool", "name": "search", "content": PASSAGES}`` (``[]`` when the last
assistant message has no search tag: that message is the final answer). The final answer is
paid as in :class:`rlvr.envs.multiturn.retry.AnswerCheck` (``answer_format`` ``"boxed"`` by default,
``"plain"``/``"tags"``, or an ``inner`` reward); a conversation that ends on a search ran out of
turns and gets ``correct = parsed = 0``. The :class:`Score` records ``searches`` (search results
in the conversation).

Pieces, each usable alone:

- :mod:`rlvr.envs.services.search`: the BM25 index, the loopback search service and its bounded client;
  :mod:`rlvr.envs.services.dense`: dense retrieval (an embedding model, an exact cosine index),
  chosen with ``retriever = "dense"`` and ``embedding_model``.
- :class:`RetrievalEnv`: starts its own service from ``corpus_path`` unless given a
  ``service_url``, and stops it on :meth:`~RetrievalEnv.close`, on leaving a ``with`` block, when
  garbage collected, or at interpreter exit.

Synthetic data for the CPU demo (no download): :func:`make_corpus` writes facts such as
``"the code of kavo is 417"`` and :func:`make_rows` asks ``"code of kavo?"`` → ``"417"`` about
them. :func:`terse` builds the whole thing for the tiny model (``<s>kavo</s>``, one passage,
plain answers) with a corpus in a temporary directory.

Standard library only (dense retrieval, when chosen, imports torch and transformers).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import tempfile
import weakref
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Self

from rlvr.envs.answers import AnswerCheck, check_max_turns, count_role, turn_of
from rlvr.envs.parsing import answer_tag, last_assistant_text
from rlvr.envs.services.search import (  # noqa: F401  (re-exported: the pieces of this environment)
    MAX_K,
    MAX_QUERY_CHARS,
    BM25Index,
    Passage,
    SearchClient,
    SearchError,
    SearchService,
    load_corpus,
    tokenize,
)
from rlvr.reward import Score
from rlvr.seeding import rng_for

__all__ = [
    "NAME", "BM25Index", "Passage", "RetrievalEnv", "SearchClient", "SearchError", "SearchService",
    "corpus_facts", "load_corpus", "load_environment", "make_corpus", "make_rows", "terse", "tokenize"
]

NAME = "retrieval"
WEIGHTS = {"correct": 1.0}
# ---------------------------------------------------------------------------------- RetrievalEnv


class RetrievalEnv:
    """Search-then-answer. See the module doc for the protocol.

    ``corpus_path``: a corpus to serve from a service this environment starts (and stops).
    ``service_url``: an already running service instead (exactly one of the two).
    ``k``: passages per search. ``max_turns``: model turns at most. ``timeout_s``: the bound on
    every HTTP call. ``answer_format``/``reward``/``casefold``: how the final answer is checked.
    ``tag``: the search tag (``<search>``). ``numbered``: prefix passages with ``[1]``, ``[2]``...
    ``retriever``: the started service's index, ``"bm25"`` (default) or ``"dense"`` (cosine over
    ``embedding_model``'s mean-pooled embeddings: a transformers model folder; :mod:`rlvr.envs.services.dense`).
    """

    name = NAME

    def __init__(self, corpus_path: str | Path | None = None, service_url: str | None = None, k: int = 3,
                 max_turns: int = 3, timeout_s: float = 5.0, *, answer_format: str = "boxed",
                 reward: Callable[..., Any] | None = None, casefold: bool = True, tag: str = "search",
                 numbered: bool = True, retriever: str = "bm25", embedding_model: str | None = None) -> None:
        if (corpus_path is None) == (service_url is None):
            raise ValueError("RetrievalEnv: give corpus_path (to start a service) or service_url (exactly one)")
        if service_url is not None and (retriever != "bm25" or embedding_model is not None):
            raise ValueError("RetrievalEnv: retriever and embedding_model choose the index of a service this "
                             "environment starts (corpus_path); the service at service_url has its own")
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
            raise ValueError(f"RetrievalEnv: k must be an integer in 1..{MAX_K}, got {k!r}")
        if not isinstance(tag, str) or not re.fullmatch(r"[A-Za-z_][\w-]*", tag):
            raise ValueError(f"RetrievalEnv: tag must be a bare tag name such as 'search', got {tag!r}")
        self.max_turns = check_max_turns(max_turns, "RetrievalEnv")
        self.k, self.tag, self.numbered = k, tag, bool(numbered)
        self.check = AnswerCheck(answer_format, reward, casefold=casefold, who="RetrievalEnv")
        self.service: SearchService | None = None
        self._cleanups: list[weakref.finalize] = []  # each also runs when collected and at interpreter exit
        if service_url is None:
            self.service = SearchService(corpus_path, retriever=retriever, embedding_model=embedding_model).start()
            self._cleanups.append(weakref.finalize(self, self.service.stop))
            service_url = self.service.url
        self.client = SearchClient(service_url, timeout_s)

    @property
    def url(self) -> str:
        return self.client.url

    def close(self) -> None:
        """Stop the service this environment started (if any) and remove its temporary files; idempotent."""
        for cleanup in self._cleanups:
            cleanup()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def query_of(self, text: str) -> str | None:
        """The content of the last ``<search>...</search>`` in ``text``, or ``None``."""
        return answer_tag(text, self.tag)

    def format_passages(self, passages: Sequence[Mapping[str, Any]]) -> str:
        if not passages:
            return "no results"
        texts = [str(p.get("text", "")) for p in passages]
        return "\n".join(f"[{i}] {t}" for i, t in enumerate(texts, 1)) if self.numbered else "\n".join(texts)

    def interact(self, messages: list[dict[str, Any]], state: dict[str, Any]) -> list[dict[str, Any]]:
        if turn_of(messages, state) >= self.max_turns:
            return []
        query = self.query_of(last_assistant_text(messages, who="RetrievalEnv.interact"))
        if query is None:
            return []
        if not query:
            return [{"role": "tool", "name": "search", "content": "error: empty search query"}]
        passages = self.client.search(query[:MAX_QUERY_CHARS], self.k)
        return [{"role": "tool", "name": "search", "content": self.format_passages(passages)}]

    def reward_fn(self, messages: Sequence[Mapping[str, Any]], answer: Any) -> Score | None:
        metrics = {"searches": float(count_role(messages, "tool", name="search"))}
        if self.query_of(last_assistant_text(messages, who="RetrievalEnv.reward_fn")) is not None:
            return Score({"correct": 0.0, "parsed": 0.0, **metrics}, WEIGHTS)  # ran out of turns mid-search
        components = self.check.components(messages, answer)
        if components is None:
            return None
        return Score({**components, **metrics}, WEIGHTS)

    def describe(self) -> dict[str, Any]:
        index = self.service.index.describe() if self.service is not None else None
        return {"type": f"{__name__}.RetrievalEnv", "url": self.url, "own_service": self.service is not None,
                "index": index,
                "k": self.k, "max_turns": self.max_turns, "tag": self.tag, **self.check.describe()}


def load_environment(**kwargs: Any) -> RetrievalEnv:
    """The factory :func:`rlvr.envs.loading.load_environment` calls with its keyword arguments."""
    return RetrievalEnv(**kwargs)


# ------------------------------------------------------------------------------ synthetic corpus

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
_SYLLABLES = [c + v for c in _CONSONANTS for v in _VOWELS]  # 70
ATTRIBUTE = "code"


def _affine(rng: Any, size: int) -> tuple[int, int]:
    """``(a, c)`` with ``gcd(a, size) == 1``: ``j -> (a*j + c) % size`` is a permutation of ``range(size)``."""
    while True:
        a = rng.randrange(1, max(2, size))
        if math.gcd(a, size) == 1:
            return a, rng.randrange(size)


def _syllables_for(corpus_size: int) -> int:
    for count in (2, 3):
        if corpus_size <= len(_SYLLABLES) ** count:
            return count
    raise ValueError(f"retrieval: corpus_size must be at most {len(_SYLLABLES) ** 3}, got {corpus_size}")


def _check_size(value: Any, what: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"retrieval: {what} must be an integer >= {low}, got {value!r}")
    return value


def corpus_facts(n: int, seed: int) -> list[dict[str, Any]]:
    """The ``n`` synthetic facts of corpus ``seed``: ``{"id", "text", "name", "value"}`` each.

    Names are distinct pronounceable words (``kavo``), values 3-digit codes; fact ``j`` depends
    only on ``(seed, j, syllable count)``, and the syllable count only changes past 4900 facts.
    """
    _check_size(n, "n", 1)
    syllables = _syllables_for(n)
    space = len(_SYLLABLES) ** syllables
    a, c = _affine(rng_for(seed, NAME, "names", syllables), space)
    facts = []
    for j in range(n):
        code, parts = (a * j + c) % space, []
        for _ in range(syllables):
            code, digit = divmod(code, len(_SYLLABLES))
            parts.append(_SYLLABLES[digit])
        name = "".join(parts)
        value = rng_for(seed, NAME, "fact", j).randint(100, 999)
        facts.append({"id": f"f{j}", "text": f"the {ATTRIBUTE} of {name} is {value}", "name": name,
                      "value": str(value)})
    return facts


def make_corpus(path: str | Path, n: int, seed: int) -> Path:
    """Write :func:`corpus_facts` ``(n, seed)`` as JSONL (``{"id", "text"}`` per line) to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"id": f["id"], "text": f["text"]}) for f in corpus_facts(n, seed)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def make_rows(n: int, *, seed: int, corpus_size: int = 1000, corpus_seed: int | None = None) -> list[dict[str, Any]]:
    """``n`` questions ``{"prompt": "code of kavo?", "answer": "417", "info": {...}}`` about the
    corpus ``make_corpus(path, corpus_size, corpus_seed)`` (``corpus_seed`` defaults to ``seed``).

    Row ``i`` asks about fact ``order[i % corpus_size]``, ``order`` a permutation of the facts
    shuffled by a generator seeded from ``(seed, corpus_size)``: a pure function of
    ``(seed, i, corpus_size, corpus_seed)``, so shorter draws are prefixes, and the first
    ``corpus_size`` rows ask about distinct facts (later rows repeat them in the same order).
    """
    _check_size(n, "n", 0)
    _check_size(corpus_size, "corpus_size", 1)
    corpus_seed = seed if corpus_seed is None else corpus_seed
    facts = corpus_facts(corpus_size, corpus_seed) if n else []
    order = list(range(corpus_size))
    rng_for(seed, NAME, "order", corpus_size).shuffle(order)
    rows = []
    for i in range(n):
        fact = facts[order[i % corpus_size]]
        info = {"task": NAME, "index": i, "fact": fact["id"], "name": fact["name"], "corpus_size": corpus_size,
                "corpus_seed": corpus_seed}
        rows.append({"prompt": f"{ATTRIBUTE} of {fact['name']}?", "answer": fact["value"], "info": info})
    return rows


def terse(corpus_size: int = 1000, corpus_seed: int = 0, corpus_path: str | Path | None = None,
          **kwargs: Any) -> RetrievalEnv:
    """The demo variant: a synthetic corpus (written to ``corpus_path`` or a temporary directory
    removed on close/exit), ``<s>query</s>``, one unnumbered passage per search, plain answers,
    two turns; ``env.make_rows(n, seed=...)`` asks questions about that corpus."""
    tmpdir = None
    if corpus_path is None:
        tmpdir = tempfile.mkdtemp(prefix="rlvr-retrieval-")
        corpus_path = Path(tmpdir) / "corpus.jsonl"
    make_corpus(corpus_path, corpus_size, corpus_seed)
    for key, value in (("k", 1), ("max_turns", 2), ("tag", "s"), ("answer_format", "plain"), ("numbered", False)):
        kwargs.setdefault(key, value)
    env = RetrievalEnv(corpus_path, **kwargs)
    if tmpdir is not None:
        env._cleanups.append(weakref.finalize(env, shutil.rmtree, tmpdir, True))
    env.make_rows = partial(make_rows, corpus_size=corpus_size, corpus_seed=corpus_seed)  # type: ignore[attr-defined]
    return env
