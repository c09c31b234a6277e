"""Local search for retrieval environments: a BM25 index, its loopback HTTP service, a bounded client.

The service serves whichever index :func:`build_index` makes: BM25 (here, the default) or dense
retrieval over an embedding model (:mod:`rlvr.envs.services.dense`, chosen with
``retriever = "dense"`` and ``embedding_model``); both answer ``search(query, k)`` alike.

- :class:`BM25Index`: Okapi BM25 in pure Python (tokens: lowercase runs of letters/digits;
  ``k1=1.5``, ``b=0.75``; idf ``ln(1 + (N - df + 0.5) / (df + 0.5))``, never negative).
  Corpora are read by :func:`~rlvr.envs.services.corpus.load_corpus` (JSONL or plain text).
- :class:`SearchService`: the index behind a small HTTP server (stdlib ``ThreadingHTTPServer``)
  bound to a **loopback** address only: ``GET /health`` → ``{"status": "ok", "passages": N}``;
  ``POST /search {"query": str, "k": int}`` → ``{"passages": [{"id", "text", "score"}]}``.
  It runs in a **background daemon thread** of the current process rather than a subprocess:
  it starts in milliseconds, needs no pickling or second interpreter, shares the in-memory index,
  and can never outlive the process that started it (no orphaned server holding a port). The
  cost, GIL contention, is small: a BM25 query over a demo-sized corpus takes well under a
  millisecond, and the heavy work of a training process (torch) releases the GIL. A corpus big
  enough for that to matter belongs in a real search server; point ``service_url`` at it.
- :class:`SearchClient`: stdlib ``urllib`` with a timeout on every call (connect and each read,
  plus an overall deadline while reading), proxies disabled, response size capped; every failure
  is a :class:`SearchError` naming the URL.

Standard library only (dense retrieval imports torch and transformers, only when chosen).
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterable, Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rlvr.envs.services.corpus import Passage, as_passage, load_corpus  # noqa: F401  (re-exported)
from rlvr.errors import SearchError

MAX_K = 50
MAX_QUERY_CHARS = 1000
MAX_BODY_BYTES = 64 * 1024
MAX_RESPONSE_BYTES = 4 * 2**20
_TOKEN = re.compile(r"[^\W_]+")


# ------------------------------------------------------------------------------------------ BM25


def tokenize(text: str) -> list[str]:
    """Lowercase runs of letters and digits: ``"The Code-of Kavo!"`` → ``["the", "code", "of", "kavo"]``."""
    return _TOKEN.findall(text.lower()) if isinstance(text, str) else []


class BM25Index:
    """Okapi BM25 over passages (``Passage`` objects, ``{"id", "text"}`` dicts or ``(id, text)`` pairs)."""

    def __init__(self, passages: Iterable[Passage | Mapping[str, Any] | tuple[str, str]], *, k1: float = 1.5,
                 b: float = 0.75) -> None:
        if not (isinstance(k1, (int, float)) and k1 >= 0 and isinstance(b, (int, float)) and 0 <= b <= 1):
            raise ValueError(f"BM25Index: need k1 >= 0 and 0 <= b <= 1, got k1={k1!r}, b={b!r}")
        self.k1, self.b = float(k1), float(b)
        self.passages: list[Passage] = [as_passage(p, "BM25Index") for p in passages]
        self._lengths: list[int] = []
        self._postings: dict[str, list[tuple[int, int]]] = {}
        for index, passage in enumerate(self.passages):
            counts = Counter(tokenize(passage.text))
            self._lengths.append(sum(counts.values()))
            for term, tf in counts.items():
                self._postings.setdefault(term, []).append((index, tf))
        self._avgdl = (sum(self._lengths) / len(self._lengths)) if self._lengths else 0.0

    @classmethod
    def from_file(cls, path: str | Path, *, format: str = "auto", **kwargs: Any) -> BM25Index:
        return cls(load_corpus(path, format=format), **kwargs)

    def __len__(self) -> int:
        return len(self.passages)

    def idf(self, term: str) -> float:
        df = len(self._postings.get(term, ()))
        return math.log(1.0 + (len(self.passages) - df + 0.5) / (df + 0.5))

    def scores(self, query: str) -> dict[int, float]:
        """Passage index → BM25 score, for passages sharing at least one term with the query."""
        out: dict[int, float] = {}
        for term in dict.fromkeys(tokenize(query)):  # each query term once, in order
            postings = self._postings.get(term)
            if not postings:
                continue
            idf = self.idf(term)
            for index, tf in postings:
                norm = self.k1 * (1.0 - self.b + self.b * self._lengths[index] / self._avgdl) if self._avgdl else 0.0
                out[index] = out.get(index, 0.0) + idf * tf * (self.k1 + 1.0) / (tf + norm)
        return out

    def search(self, query: str, k: int = 3) -> list[dict[str, Any]]:
        """The ``k`` best passages as ``{"id", "text", "score"}``, best first (ties: corpus order)."""
        scored = self.scores(query)
        best = sorted(scored.items(), key=lambda item: (-item[1], item[0]))[: max(0, k)]
        return [{"id": self.passages[i].id, "text": self.passages[i].text, "score": score} for i, score in best]

    def describe(self) -> dict[str, Any]:
        return {"retriever": "bm25", "passages": len(self), "k1": self.k1, "b": self.b}


RETRIEVERS = ("bm25", "dense")


def build_index(corpus_path: str | Path, *, retriever: str = "bm25", embedding_model: str | None = None,
                format: str = "auto", **options: Any) -> Any:
    """The index ``retriever`` names over the corpus at ``corpus_path``: :class:`BM25Index`
    (``options``: ``k1``, ``b``), or a dense index over ``embedding_model`` (a transformers model
    folder; ``options``: ``device``, ``batch_size``, ``max_length``;
    :class:`~rlvr.envs.services.dense.DenseIndex`, which needs torch and transformers)."""
    if retriever not in RETRIEVERS:
        raise ValueError(f"retriever={retriever!r}: choose one of {', '.join(RETRIEVERS)}")
    if retriever == "bm25":
        if embedding_model is not None:
            raise ValueError("embedding_model is for retriever = 'dense'; BM25 needs no model")
        return BM25Index.from_file(corpus_path, format=format, **options)
    if not embedding_model:
        raise ValueError("retriever = 'dense' needs embedding_model: a transformers model folder to embed with")
    from rlvr.envs.services.dense import DenseIndex  # torch and transformers: only for dense retrieval

    return DenseIndex(load_corpus(corpus_path, format=format), embedding_model, **options)


# --------------------------------------------------------------------------------------- service


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    index: Any  # BM25Index or DenseIndex: len() and search(query, k)
    max_k: int


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "rlvr-search/1"
    protocol_version = "HTTP/1.0"  # one request per connection: nothing lingers
    timeout = 10  # a client that connects and goes quiet is dropped, freeing its thread

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _reply(self, status: int, payload: Mapping[str, Any]) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if urlsplit(self.path).path == "/health":
            self._reply(HTTPStatus.OK, {"status": "ok", "passages": len(self.server.index)})
        else:
            self._reply(HTTPStatus.NOT_FOUND, {"error": f"no route GET {self.path}; try GET /health or POST /search"})

    def do_POST(self) -> None:
        if urlsplit(self.path).path != "/search":
            self._reply(HTTPStatus.NOT_FOUND, {"error": f"no route POST {self.path}; try POST /search"})
            return
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            self._reply(HTTPStatus.LENGTH_REQUIRED, {"error": "POST /search needs a Content-Length"})
            return
        if int(length) > MAX_BODY_BYTES:
            self._reply(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"error": f"body over {MAX_BODY_BYTES} bytes"})
            return
        try:
            request = json.loads(self.rfile.read(int(length)) or b"null")
        except ValueError:
            self._reply(HTTPStatus.BAD_REQUEST, {"error": "body is not JSON"})
            return
        error = _check_request(request, self.server.max_k)
        if error:
            self._reply(HTTPStatus.BAD_REQUEST, {"error": error})
            return
        passages = self.server.index.search(request["query"], request.get("k", 3))
        self._reply(HTTPStatus.OK, {"passages": passages})


def _check_request(request: Any, max_k: int) -> str | None:
    if not isinstance(request, dict):
        return 'expected {"query": str, "k": int}'
    query, k = request.get("query"), request.get("k", 3)
    if not isinstance(query, str):
        return "'query' must be a string"
    if len(query) > MAX_QUERY_CHARS:
        return f"'query' is longer than {MAX_QUERY_CHARS} characters"
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= max_k:
        return f"'k' must be an integer in 1..{max_k}"
    return None


def _check_loopback(host: str) -> None:
    if host == "localhost":
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(f"SearchService: host must be a loopback address (127.0.0.1, ::1 or localhost), got "
                         f"{host!r}; the service has no authentication and must not be reachable from outside")


class SearchService:
    """A search index served over HTTP on loopback, in a background daemon thread of this process.

    ``SearchService(corpus_path)`` (BM25; ``retriever="dense", embedding_model=FOLDER`` for dense
    retrieval: :func:`build_index`'s options) or ``SearchService(index=BM25Index(...))``; ``port=0`` picks a
    free port. ``start()`` returns ``self`` once the server is listening; ``url`` is then
    ``http://HOST:PORT``. ``stop()`` is idempotent. Also a context manager.
    """

    def __init__(self, corpus_path: str | Path | None = None, host: str = "127.0.0.1", port: int = 0, *,
                 index: Any = None, max_k: int = MAX_K, **index_options: Any) -> None:
        _check_loopback(host)
        if (corpus_path is None) == (index is None):
            raise ValueError("SearchService: give corpus_path or index (exactly one)")
        self.index = index if index is not None else build_index(corpus_path, **index_options)  # type: ignore[arg-type]
        self.host, self.port, self.max_k = host, port, max_k
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("SearchService: not started; call start() first")
        host, port = self._server.server_address[:2]
        host = host.decode() if isinstance(host, bytes) else host
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    @property
    def address(self) -> tuple[str, int]:
        """The address the listening socket is bound to (from the socket itself)."""
        if self._server is None:
            raise RuntimeError("SearchService: not started; call start() first")
        host, port = self._server.socket.getsockname()[:2]
        return host, port

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> SearchService:
        with self._lock:
            if self._server is not None:
                return self
            server_cls: type[_Server] = _Server
            if ":" in self.host:
                server_cls = _Server6
            server = server_cls((self.host, self.port), _Handler)
            server.index, server.max_k = self.index, self.max_k
            thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                                      name=f"rlvr-search:{server.server_address[1]}", daemon=True)
            thread.start()
            self._server, self._thread = server, thread
        return self

    def stop(self) -> None:
        with self._lock:
            server, thread = self._server, self._thread
            self._server = self._thread = None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(5)

    def __enter__(self) -> SearchService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ---------------------------------------------------------------------------------------- client


class SearchClient:
    """Talks to a search service with bounded time: ``timeout_s`` for connecting and for each
    read, and the whole response must arrive within ``timeout_s`` of the request being sent."""

    def __init__(self, url: str, timeout_s: float = 5.0) -> None:
        if not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc:
            raise ValueError(f"SearchClient: url must look like http://HOST:PORT, got {url!r}")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s <= 300:
            raise ValueError(f"SearchClient: timeout_s must be in (0, 300], got {timeout_s!r}")
        self.url, self.timeout_s = url.rstrip("/"), float(timeout_s)
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy

    def health(self) -> dict[str, Any]:
        return self._request("GET", "/health")

    def search(self, query: str, k: int = 3) -> list[dict[str, Any]]:
        answer = self._request("POST", "/search", {"query": query, "k": k})
        passages = answer.get("passages")
        if not isinstance(passages, list) or not all(isinstance(p, dict) and isinstance(p.get("text"), str)
                                                     for p in passages):
            raise SearchError(f"search service {self.url}/search answered without a 'passages' list: "
                              f"{json.dumps(answer)[:200]}")
        return passages

    def _request(self, method: str, path: str, payload: Any = None) -> dict[str, Any]:
        url = self.url + path
        data = None if payload is None else json.dumps(payload).encode()
        request = urllib.request.Request(url, data=data, method=method,
                                         headers={"Content-Type": "application/json", "Accept": "application/json"})
        deadline = time.monotonic() + self.timeout_s
        try:
            with self._opener.open(request, timeout=self.timeout_s) as response:
                body = _read_before(response, deadline)
        except urllib.error.HTTPError as exc:
            try:
                detail = exc.read(300).decode("utf-8", "replace")
            except Exception:  # noqa: BLE001 - the status is the message; the body is a bonus
                detail = ""
            raise SearchError(f"search service {url} answered HTTP {exc.code}: {detail}") from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise SearchError(f"search service {url} did not answer within {self.timeout_s:g}s") from None
            raise SearchError(f"search service {url} is unreachable: {exc.reason}") from None
        except TimeoutError:
            raise SearchError(f"search service {url} did not answer within {self.timeout_s:g}s") from None
        except Exception as exc:  # noqa: BLE001 - OSError, http.client.HTTPException, an oversized body...
            raise SearchError(f"search service {url} failed: {type(exc).__name__}: {exc}") from None
        try:
            answer = json.loads(body)
        except ValueError:
            raise SearchError(f"search service {url} answered with invalid JSON: {body[:200]!r}") from None
        if not isinstance(answer, dict):
            raise SearchError(f"search service {url} answered {body[:200]!r}, not a JSON object")
        return answer


def _read_before(response: Any, deadline: float) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        if time.monotonic() > deadline:
            raise TimeoutError
        chunk = response.read1(65536)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > MAX_RESPONSE_BYTES:
            raise ValueError(f"response larger than {MAX_RESPONSE_BYTES} bytes")
        chunks.append(chunk)
