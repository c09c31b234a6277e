"""What ``rlvr serve`` accepts: the API key, the folders weights load from, whom it answers (the
bound address and the web origins allowed: :mod:`rlvr.backends.web_guard`), and every limit on what
a client can make it do, each checked at construction naming its ``rlvr serve`` flag.

A backend module: plain Python.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from rlvr.backends.serve.render import RenderLimits
from rlvr.backends.web_guard import WebRules
from rlvr.errors import UsageError


@dataclass(frozen=True)
class ServerPolicy:
    """What ``rlvr serve`` accepts. ``api_key``: every endpoint but ``/health`` needs
    ``Authorization: Bearer <key>`` (the OpenAI client's ``api_key``); required to bind beyond
    loopback. ``allowed_dirs``: the only folders adapters and weights may be loaded from (none by
    default: the admin endpoints refuse every path). Limits: request body size and the time it may
    take to arrive, samples per request (prompts × ``n``), requests in flight (counted once their
    body is read; beyond: 429, retry later), and chat rendering (:class:`RenderLimits`). Each limit
    is checked at construction, naming its ``rlvr serve`` flag. ``bind`` (the address served on)
    and ``allowed_origins`` (``--allowed-origin``) decide which Host and Origin headers are
    answered (:meth:`web_rules`)."""

    api_key: str | None = None
    allowed_dirs: tuple[str, ...] = ()
    max_body_bytes: int = 8 * 2**20
    max_samples: int = 256
    max_in_flight: int = 64
    body_timeout_s: float = 30.0
    render: RenderLimits = RenderLimits()
    bind: str = "127.0.0.1"
    allowed_origins: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        at_least = [("--max-body-mb", self.max_body_bytes, 1), ("--max-samples", self.max_samples, 1),
                    ("--max-in-flight", self.max_in_flight, 1), ("--body-timeout-s", self.body_timeout_s, 0.001),
                    ("--render-workers", self.render.workers, 1), ("--render-timeout-s", self.render.timeout_s, 0.001),
                    ("--render-memory-mb", self.render.memory_mb, 16),
                    ("--max-template-chars", self.render.max_template_chars, 1),
                    ("--max-prompt-chars", self.render.max_prompt_chars, 1)]
        for flag, value, low in at_least:
            if not isinstance(value, int | float) or value != value or value < low or value == float("inf"):
                raise UsageError(f"rlvr serve {flag} must be a finite number of at least {low} (got {value!r})")
        if self.api_key is not None and (not self.api_key or any(c.isspace() or not c.isprintable()
                                                                 for c in self.api_key)):
            raise UsageError("rlvr serve: the API key must be non-empty printable text without spaces")
        self.web_rules()  # the origins are checked now, naming --allowed-origin

    def web_rules(self) -> WebRules:
        return WebRules(bind=self.bind, key_required=self.api_key is not None,
                        allowed_origins=self.allowed_origins, command="rlvr serve")

    def allows(self, path: str) -> bool:
        real = os.path.realpath(path)
        return any(real == d or real.startswith(d.rstrip(os.sep) + os.sep)
                   for d in (os.path.realpath(a) for a in self.allowed_dirs))
