"""What a web page may not make rlvr's HTTP servers do: the guard in front of ``rlvr serve``,
``rlvr rollout-worker``, ``rlvr proxy`` (and a run's recording proxy).

A page open in the user's browser can send requests to any address the machine reaches, loopback
included: a "simple" cross-origin request (a form's or ``fetch``'s ``text/plain`` POST) is sent
without asking the server first, and a page whose own name its owner re-points at 127.0.0.1 (DNS
rebinding) reads the answers as its own. So before any route runs, :class:`WebGuard` refuses:

- a ``Host`` that is not the server's (:meth:`WebRules.host_refusal`): bound to loopback, only
  ``localhost``, ``127.0.0.1``, ``[::1]`` (any loopback address) and the bound name, with any port;
  bound to a named address, that name; bound beyond loopback with a key required (``0.0.0.0``
  included), any Host: clients reach such a server under names it cannot know, and the key, which a
  browser never adds on its own, is what a rebound page lacks. Bound to ``0.0.0.0`` without a key
  (the commands refuse to start so), only loopback names and IP literals, never a DNS name. 403.
- an ``Origin`` other than the server's own (the Host's name and port) unless listed with
  ``--allowed-origin`` (:meth:`WebRules.origin_refusal`); ``Origin: null`` (a sandboxed page, a
  file) is never the server's own. A listed origin also gets the CORS answers its browser needs
  (preflights, ``Access-Control-Allow-Origin``). 403.
- a body whose ``Content-Type`` is not ``application/json`` (any POST, PUT, PATCH or DELETE that has a
  body or names a type): no simple request can send JSON, so a page cannot without asking first. 415.

Invariant: a refused request is answered by the guard itself, with the app's own JSON error shape
naming the header at fault, so no route, key check or body read runs for it. ``GET /health`` is
never refused (it runs nothing and says only that the server is up: a load balancer's probe).

A backend module: imports starlette.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import Response

from rlvr.errors import RequestError, UsageError

WILDCARDS = ("", "0.0.0.0", "::", "[::]")
BODY_METHODS = ("POST", "PUT", "PATCH", "DELETE")
DEFAULT_PORTS = {"http": 80, "https": 443}


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` resolves to is a loopback one (``localhost.example.com`` is
    not loopback, whatever its name says; a name that does not resolve is not either)."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return False
    addresses = {str(info[4][0]).split("%")[0] for info in infos}
    return bool(addresses) and all(ipaddress.ip_address(a).is_loopback for a in addresses)


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def _loopback_name(name: str) -> bool:
    """``localhost`` or a loopback IP literal: names no DNS answer can re-point."""
    ip = _ip(name)
    return name == "localhost" or (ip is not None and ip.is_loopback)


def split_host(value: str) -> tuple[str, int | None] | None:
    """A Host header's name (lower case, IPv6 without brackets) and port; ``None`` when malformed."""
    value = value.strip().lower()
    if value.startswith("["):
        name, sep, rest = value[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")) or _ip(name) is None:
            return None
        port = rest[1:] if rest else None
    else:
        name, sep, port = value.partition(":")
        port = port if sep else None
        if not name or any(c in name for c in "/@?#\\ :[]"):
            return None
    if port is not None and not port.isdigit():
        return None
    if port is not None and not 0 < int(port) < 65536:
        return None
    return name, int(port) if port is not None else None


def split_origin(value: str) -> tuple[str, str, int] | None:
    """An origin's scheme, host and port (the scheme's default when unsaid); ``None`` when it is not
    ``http(s)://host[:port]``."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme.lower() not in DEFAULT_PORTS or not parts.hostname or parts.path not in ("", "/") or \
            parts.query or parts.fragment or parts.username is not None:
        return None
    scheme = parts.scheme.lower()
    return scheme, parts.hostname.lower(), port or DEFAULT_PORTS[scheme]


@dataclass(frozen=True)
class WebRules:
    """Whom a server answers: ``bind`` (the address it listens on), whether a key is required, and
    the origins besides its own that may call it (``--allowed-origin``; checked at construction,
    naming ``command``'s flag)."""

    bind: str = "127.0.0.1"
    key_required: bool = False
    allowed_origins: tuple[str, ...] = ()
    command: str = "rlvr serve"
    _origins: frozenset[tuple[str, str, int]] = field(init=False, repr=False, compare=False)
    _loopback: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for origin in self.allowed_origins:
            if split_origin(origin) is None:
                raise UsageError(f"{self.command} --allowed-origin {origin!r}: an origin is scheme://host[:port] "
                                 "(http or https, no path), e.g. http://localhost:3000")
        object.__setattr__(self, "_origins", frozenset(split_origin(o) for o in self.allowed_origins))
        name = self.bind.strip().strip("[]").lower()
        object.__setattr__(self, "_loopback", name == "localhost" or is_loopback(name))  # resolved once

    def host_refusal(self, host: str | None) -> RequestError | None:
        bind = self.bind.strip().strip("[]").lower()
        wildcard = self.bind.strip() in WILDCARDS
        parsed = split_host(host) if host else None
        if parsed is not None:
            name = parsed[0]
            if name == bind or ((wildcard or self._loopback) and _loopback_name(name)):
                return None
            if not self._loopback and self.key_required:  # wildcards included: they are not loopback
                return None  # reached beyond loopback under names it cannot know: the key decides
            if wildcard and _ip(name) is not None:
                return None  # an IP literal is not a name a page can re-point
        where = "localhost, 127.0.0.1 or [::1]" if self._loopback or wildcard else bind
        shown = host if host is None else host[:200]
        return RequestError(f"the Host header {shown!r} is not this server's address (reach it as {where}): a web "
                            "page re-pointing its own name at this machine (DNS rebinding) would send it", "Host", 403)

    def origin_refusal(self, origin: str | None, host: str | None) -> RequestError | None:
        if origin is None or self.allowed(origin):
            return None
        parsed, own = split_origin(origin), split_host(host or "")
        if parsed is not None and own is not None:
            scheme, name, port = parsed
            if name.strip("[]") == own[0] and port == (own[1] or DEFAULT_PORTS[scheme]):
                return None
        return RequestError(f"a request from the web page at {origin[:200]!r} is refused: only this server's own "
                            f"origin and those given with {self.command} --allowed-origin may call it", "Origin", 403)

    def allowed(self, origin: str) -> bool:
        return split_origin(origin) in self._origins

    def body_refusal(self, method: str, headers: Headers) -> RequestError | None:
        if method.upper() not in BODY_METHODS:
            return None
        declared = headers.get("content-type")
        has_body = headers.get("content-length", "0").strip() != "0" or "transfer-encoding" in headers
        if declared is None and not has_body:
            return None
        if (declared or "").split(";")[0].strip().lower() == "application/json":
            return None
        return RequestError(f"the request body's Content-Type is {declared!r}; this server reads only "
                            "application/json", "Content-Type", 415)


class WebGuard:
    """ASGI middleware enforcing :class:`WebRules`; ``error`` turns a refusal into the app's JSON
    error response. Add it last (``app.add_middleware``), so it runs before the app's own guards."""

    def __init__(self, app: Any, rules: WebRules, error: Callable[[RequestError], Response]):
        self.app, self.rules, self.error = app, rules, error

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or (scope["path"] == "/health" and scope["method"] in ("GET", "HEAD")):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        refusal = (self.rules.host_refusal(headers.get("host"))
                   or self.rules.origin_refusal(origin, headers.get("host"))
                   or self.rules.body_refusal(scope["method"], headers))
        if refusal is not None:
            await self.error(refusal)(scope, receive, send)
            return
        if origin is None or not self.rules.allowed(origin):
            await self.app(scope, receive, send)
            return
        if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            await _preflight(origin, headers)(scope, receive, send)
            return

        async def send_allowed(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                cors = MutableHeaders(scope=message)
                cors["access-control-allow-origin"] = origin
                cors.append("vary", "Origin")
            await send(message)

        await self.app(scope, receive, send_allowed)


def _preflight(origin: str, headers: Headers) -> Response:
    """A listed origin's browser asking first (a JSON body, an Authorization header): yes."""
    return Response(status_code=204, headers={
        "access-control-allow-origin": origin, "access-control-allow-methods": "GET, POST, OPTIONS",
        "access-control-allow-headers": headers.get("access-control-request-headers", ""),
        "access-control-max-age": "600", "vary": "Origin"})
