"""Dense retrieval for the local search service: mean-pooled embeddings from a tiny transformers
model built here (no hub), exact cosine search, and ``retriever = "dense"`` chosen through the
retrieval environment's arguments (``task.env_args``)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from rlvr.backends.model.tiny import build_tiny_model  # noqa: E402
from rlvr.envs import environment  # noqa: E402
from rlvr.envs.services.dense import DenseIndex, Embedder  # noqa: E402
from rlvr.envs.services.search import BM25Index, SearchClient, SearchService  # noqa: E402
from rlvr.errors import ConfigError  # noqa: E402

# Each passage is written in its own letters, so a query in those letters (sharing no whole word
# with it) is near it in any bag-of-characters geometry: what mean pooling over a character-level
# model's states gives, even with random weights. BM25, matching whole words, finds nothing.
CORPUS = [
    {"id": "a", "text": "abba baab abab"},
    {"id": "x", "text": "xyzzy zyx yzx"},
    {"id": "m", "text": "mnop pomn nmop"},
    {"id": "d", "text": "1234 4321 2143"},
    {"id": "q", "text": "qrst tsrq rqts"},
]
QUERIES = {"bab": "a", "zzyx": "x", "onm": "m", "3412": "d", "srt": "q"}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("embed") / "tiny", hidden=64, layers=1, heads=2, seed=0)


@pytest.fixture(scope="module")
def index(model):
    return DenseIndex(CORPUS, model, batch_size=2)


def test_dense_retrieval_finds_the_passage_bm25_cannot(index):
    bm25 = BM25Index(CORPUS)
    for query, expected in QUERIES.items():
        assert bm25.search(query, k=1) == []  # no shared word
        best = index.search(query, k=len(CORPUS))
        assert best[0]["id"] == expected, (query, best)
        assert [hit["score"] for hit in best] == sorted((hit["score"] for hit in best), reverse=True)
        assert -1.0 - 1e-5 <= best[-1]["score"] <= best[0]["score"] <= 1.0 + 1e-5


def test_embeddings_are_unit_vectors_and_padding_changes_nothing(model):
    embedder = Embedder(model, batch_size=8)
    texts = ["a", "a much longer text that pads the short one"]
    together = embedder.embed(texts)
    alone = torch.cat([embedder.embed([t]) for t in texts])
    assert together.shape == (2, embedder.dim)
    assert torch.allclose(together.norm(dim=-1), torch.ones(2), atol=1e-5)
    assert torch.allclose(together, alone, atol=1e-5)


def test_the_service_serves_a_dense_index(index):
    with SearchService(index=index) as service:
        client = SearchClient(service.url)
        assert client.health()["passages"] == len(CORPUS)
        assert client.search("zzyx", k=2)[0]["id"] == "x"


def test_the_retrieval_environment_chooses_dense_from_its_arguments(model, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(row) + "\n" for row in CORPUS))
    # What [task] env = "retrieval", env_args = {retriever = "dense", embedding_model = ...} loads.
    loaded = environment("retrieval", corpus_path=str(corpus), retriever="dense", embedding_model=str(model), k=1)
    try:
        turn = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<search>onm</search>"}]
        assert loaded.interact(turn, {"turn": 1})[0]["content"] == "[1] mnop pomn nmop"
        assert loaded.source.describe()["index"]["retriever"] == "dense"
    finally:
        loaded.source.close()
    with pytest.raises(ValueError, match="needs embedding_model"):
        environment("retrieval", corpus_path=str(corpus), retriever="dense")
    with pytest.raises(ValueError, match="choose one of bm25, dense"):
        environment("retrieval", corpus_path=str(corpus), retriever="splade")
    with pytest.raises(ConfigError, match="embedding_model"):
        environment("retrieval", corpus_path=str(corpus), retriever="dense", embedding_model=str(tmp_path))
