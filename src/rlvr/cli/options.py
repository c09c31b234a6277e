"""Command-line options more than one subcommand takes: the bounds on chat-template rendering, the web
origins a server answers, and the argparse types for positive numbers and ports."""

from __future__ import annotations

import argparse
from typing import Any


def add_render_arguments(p: argparse.ArgumentParser) -> None:
    """The flags bounding chat-template rendering (:class:`~rlvr.backends.serve.render.RenderLimits`)."""
    p.add_argument("--render-workers", type=positive(int), default=2,
                   help="processes that render chat templates and tokenize prompts (default 2)")
    p.add_argument("--render-timeout-s", type=positive(float), default=10.0,
                   help="longest a prompt may take to render and tokenize; beyond, 413 (default 10)")
    p.add_argument("--render-memory-mb", type=positive(int), default=1024,
                   help="memory a render worker may allocate for one prompt; beyond, 413 (default 1024)")
    p.add_argument("--max-template-chars", type=positive(int), default=1 << 16,
                   help="longest chat_template a request may send (default 65536)")
    p.add_argument("--max-prompt-chars", type=positive(int), default=1 << 20,
                   help="longest prompt text, before or after rendering (default 1048576)")


def render_limits(args: argparse.Namespace, command: str) -> Any:
    from rlvr.backends.serve.render import RenderLimits

    return RenderLimits(workers=args.render_workers, timeout_s=args.render_timeout_s, memory_mb=args.render_memory_mb,
                        max_template_chars=args.max_template_chars, max_prompt_chars=args.max_prompt_chars,
                        command=command)


def add_origin_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allowed-origin", action="append", default=[], metavar="ORIGIN",
                   help="a web page origin (scheme://host[:port]) whose requests are answered, CORS included "
                        "(repeatable; default none: a browser page gets 403, only the server's own origin passes)")


def positive(kind: type) -> Any:
    """An argparse type: a finite number above 0 (argparse names the flag when it is not)."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not 0 < value < float("inf"):
            raise argparse.ArgumentTypeError(f"{text} must be above 0")
        return value
    return parse


def port_number(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is outside 1-65535")
    return port
