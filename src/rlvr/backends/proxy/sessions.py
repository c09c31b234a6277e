"""The proxy's sessions: one per agent episode, each with the generator and sampling rule it samples
under, and the calls recorded for it.

Invariants:
- every model call of a session is recorded once, with exactly the ids the generator was given and
  answered (cut where the answer was cut), their log-probs, the policy version and the server;
- a call's index is its arrival order in the session, taken before it samples, so concurrent calls
  (parallel sub-agents) each get their own;
- a call the agent never saw is never recorded: a request whose client disconnects before its answer
  is cancelled before it records anything, and a client's retry (the ``x-stainless-retry-count``
  header the OpenAI and Anthropic clients send, over the same body; or a repeated
  ``Idempotency-Key``) supersedes the try it repeats, whose calls are dropped from the record (and
  never recorded if that try is still running);
- a closed session answers nothing more: a late call is refused (HTTP 404), never recorded into
  another episode;
- sampling follows the session's rule: in a run, the run's temperature and ``top_p`` (greedy for
  held-out), whatever the agent asked, and at most the run's token budget per call; by hand, the
  request's own values.

A backend module: imports only the core (turn matching, seeding).
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import secrets
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr.errors import RequestError
from rlvr.rollouts.turns import Call, Segment, Turn, match_turns
from rlvr.seeding import derive_seed
from rlvr.types import Completion, SamplingParams

GREEDY_BELOW = 1e-5  # as rlvr serve and vLLM: a temperature under this samples greedily
SESSION_HEADERS = ("x-multi-turn-session-id", "x-session-affinity", "x-session-id")
RETRY_HEADER = "x-stainless-retry-count"  # how many tries came before this one (OpenAI's and Anthropic's clients)
IDEMPOTENCY_HEADER = "idempotency-key"


@dataclass(slots=True)
class Attempt:
    """One HTTP request, as a try of what the client asked: ``key`` names what it asked (its
    ``Idempotency-Key``, else a digest of its route and body), ``retry`` how many tries came before
    it. A later try supersedes it: its calls leave the record."""

    key: str
    retry: int = 0
    keyed: bool = False
    superseded: bool = False
    calls: list[int] = field(default_factory=list)


def attempt_of(headers: Mapping[str, str], route: str, body: bytes) -> Attempt:
    """The try a request is, from its headers (case-insensitive mapping) and raw body."""
    raw = headers.get(RETRY_HEADER, "0").strip()
    retry = int(raw) if raw.isdigit() else 0
    key = headers.get(IDEMPOTENCY_HEADER)
    if key:
        return Attempt(f"key:{route}:{key}", retry, keyed=True)
    digest = hashlib.sha256(route.encode() + b"\0" + body).hexdigest()
    return Attempt(f"body:{digest}", retry)


@dataclass(slots=True)
class Session:
    """One episode's sampling rule and record. ``params`` ``None``: the request decides (by hand)."""

    id: str
    generator: Any
    params: SamplingParams | None
    seed: int | None
    meta: dict[str, Any] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    next_index: int = 0
    closed: bool = False
    attempts: list[Attempt] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Closed:
    """What a session left: its calls in arrival order, the verdict on each, and the segments."""

    session: str
    calls: list[Call]
    turns: list[Turn]
    segments: list[Segment]


class SessionBook:
    """The open sessions of one proxy. ``default``: a generator that serves sessions nobody opened
    (``rlvr proxy``: any session id is opened on first use); ``None`` refuses them (a run)."""

    def __init__(self, *, default: Any = None, budget: int = 256, record: str | Path | None = None,
                 record_tokens: bool = False):
        self.default, self.budget, self.record_tokens = default, budget, record_tokens
        self.record = Path(record) if record is not None else None
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()  # opened from rollout threads, used from the proxy's loop

    def open(self, generator: Any, params: SamplingParams | None, *, seed: int | None = None,
             session: str | None = None, meta: Mapping[str, Any] | None = None) -> str:
        sid = session or secrets.token_hex(8)
        with self._lock:
            if sid in self._sessions:
                raise ValueError(f"proxy session {sid!r} is already open")
            self._sessions[sid] = Session(sid, generator, params, seed, dict(meta or {}))
        return sid

    def get(self, sid: str | None) -> Session:
        with self._lock:
            if sid is None:
                if self.default is None:
                    raise RequestError("no session: call through the episode's base URL (/s/<session>/v1) or send "
                                       f"one of the headers {', '.join(SESSION_HEADERS)}", None, 400)
                sid = "default"
            session = self._sessions.get(sid)
            if session is None and self.default is not None:
                session = self._sessions[sid] = Session(sid, self.default, None, None)
            if session is None or session.closed:
                state = "has ended" if session is not None else "is not open"
                raise RequestError(f"proxy session {sid!r} {state}: its episode is not accepting model calls",
                                   None, 404)
            return session

    def close(self, sid: str) -> Closed:
        """End ``sid``: its calls, matched into turns and segments, appended to the record file if any."""
        with self._lock:
            session = self._sessions.pop(sid, None)
        if session is None:
            raise KeyError(f"proxy session {sid!r} is not open")
        session.closed = True
        forget = getattr(session.generator, "forget", None)
        if forget is not None:  # a server pool's pin of this session
            forget(sid)
        return self.closed(session)

    def peek(self, sid: str) -> Closed:
        """What ``sid`` has recorded so far, without ending it."""
        with self._lock:
            session = self._sessions.get(sid)
        if session is None:
            raise RequestError(f"proxy session {sid!r} is not open", None, 404)
        return self.closed(session, write=False)

    def closed(self, session: Session, *, write: bool = True) -> Closed:
        calls = sorted(session.calls, key=lambda c: c.index)
        turns, segments = match_turns(calls)
        done = Closed(session.id, calls, turns, segments)
        if write and self.record is not None:
            self.record.parent.mkdir(parents=True, exist_ok=True)
            with self.record.open("a", encoding="utf-8") as f:
                f.write(json.dumps(describe(done, session.meta, tokens=self.record_tokens)) + "\n")
        return done

    def ids(self) -> list[str]:
        with self._lock:
            return sorted(self._sessions)

    def begin(self, session: Session, attempt: Attempt) -> None:
        """Register ``attempt``, superseding the try it repeats: any earlier one with its
        ``Idempotency-Key``; for a retry, the latest earlier try of the same body that came before
        it (a first try sent twice on purpose, as for self-consistency, is two tries, both kept)."""
        with self._lock:
            live = [a for a in session.attempts if a.key == attempt.key and not a.superseded]
            if attempt.keyed:
                repeated = live
            else:
                repeated = [a for a in live if a.retry < attempt.retry][-1:] if attempt.retry > 0 else []
            for earlier in repeated:
                earlier.superseded = True
                gone = set(earlier.calls)
                session.calls = [c for c in session.calls if c.index not in gone]
            session.attempts.append(attempt)

    def keep(self, session: Session, attempt: Attempt | None, calls: Sequence[Call]) -> None:
        """Record ``calls`` of ``attempt`` (``None``: not a client's request), unless a retry has
        superseded it meanwhile."""
        with self._lock:
            if attempt is not None:
                if attempt.superseded:
                    return
                attempt.calls += [c.index for c in calls]
            session.calls += calls

    def take_index(self, session: Session, n: int) -> int:
        """Reserve ``n`` call indices (one per choice) for a call arriving now; the first is returned."""
        with self._lock:
            first, session.next_index = session.next_index, session.next_index + n
        return first


def describe(done: Closed, meta: Mapping[str, Any], *, tokens: bool = False) -> dict[str, Any]:
    """One JSON line per episode: who it was, each call (kind, segment, server, version, sizes) and
    each segment (its calls and how many tokens it trains on); with ``tokens``, the ids and log-probs."""
    verdict = {t.call: t for t in done.turns}
    calls = []
    for c in done.calls:
        t = verdict[c.index]
        row: dict[str, Any] = {"call": c.index, "kind": str(t.kind), "segment": t.segment, "reason": t.reason,
                               "server": c.server, "version": c.version, "stop": str(c.stop_reason),
                               "prompt_tokens": len(c.prompt_ids), "completion_tokens": len(c.completion_ids)}
        if tokens:
            row.update(prompt_ids=list(c.prompt_ids), completion_ids=list(c.completion_ids),
                       logprobs=list(c.logprobs), messages=c.messages, reply=c.reply)
        calls.append(row)
    segments = [{"calls": list(s.calls), "prompt_tokens": len(s.prompt_ids),
                 "completion_tokens": len(s.completion_ids), "trained_tokens": s.generated, "version": s.version}
                for s in done.segments]
    servers = sorted({c.server for c in done.calls if c.server is not None})
    return {"session": done.session, **dict(meta), "servers": servers, "calls": calls, "segments": segments}


# ---- sampling ------------------------------------------------------------------------------------
def sampling_params(session: Session, *, temperature: float | None, top_p: float | None, max_tokens: int | None,
                    stop_token_ids: Sequence[int], budget: int) -> SamplingParams:
    """The parameters one call samples with under its session's rule (see the module docstring)."""
    rule = session.params
    if rule is not None:
        wanted = max_tokens if max_tokens is not None else rule.max_tokens
        return dataclasses.replace(rule, max_tokens=min(wanted, rule.max_tokens),
                                   stop_token_ids=tuple(dict.fromkeys((*rule.stop_token_ids, *stop_token_ids))))
    t = 1.0 if temperature is None else temperature
    return SamplingParams(max_tokens=max_tokens if max_tokens is not None else budget,
                          temperature=0.0 if t < GREEDY_BELOW else t, top_p=1.0 if top_p is None else top_p,
                          stop_token_ids=tuple(stop_token_ids))


def call_seed(session: Session, index: int, requested: int | None) -> int:
    """In a run, a function of the episode's seed and the call's place; by hand, the request's seed."""
    if session.seed is not None:
        return derive_seed(session.seed, "call", index)
    return requested if requested is not None else secrets.randbits(63)


async def generate(session: Session, prompt: Sequence[int], params: SamplingParams, seed: int) -> Completion:
    """One completion from the session's generator, with the session id where the generator routes
    by it (a server pool keeps an episode on one server)."""
    generate_fn: Callable[..., Any] = session.generator.generate
    if _takes_session(generate_fn):
        return await generate_fn(list(prompt), params, seed=seed, session_id=session.id)
    return await generate_fn(list(prompt), params, seed=seed)


def server_of(session: Session) -> str | None:
    """Which server answered the session (a pool's pinned member, one server's URL), if known."""
    pinned = getattr(session.generator, "server_of", None)
    if pinned is not None:
        return pinned(session.id)
    url = getattr(session.generator, "url", None)
    return str(url) if url is not None else None


def _takes_session(fn: Callable[..., Any]) -> bool:
    try:
        return "session_id" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
