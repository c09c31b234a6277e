"""``rlvr rollout-worker``: serve a training run's rows over HTTP from another process or machine.

The run side (which workers a run starts or reaches, and the rollout function over them) is
:mod:`rlvr.wiring.scale.rollout_workers`; this module is only the command.
"""

from __future__ import annotations

from typing import Any

from rlvr.cli.options import add_origin_argument


def cmd_rollout_worker(args: Any) -> int:
    import os

    from rlvr.backends.rollout.app import serve_worker
    from rlvr.backends.web_guard import WebRules

    WebRules(allowed_origins=tuple(args.allowed_origin), command="rlvr rollout-worker")  # names a bad origin now
    return serve_worker(host=args.host, port=args.port, api_key=args.api_key or os.environ.get("RLVR_API_KEY") or None,
                        allowed_dirs=tuple(os.path.abspath(d) for d in args.allowed_dir),
                        allow_modules=tuple(args.allow_module), allowed_origins=tuple(args.allowed_origin),
                        parent_pid=args.parent_pid, url_file=args.url_file, max_in_flight=args.max_in_flight,
                        log_level=args.log_level)


def add_parser(sub: Any) -> None:
    w = sub.add_parser("rollout-worker", help="run rollouts for a training run elsewhere (its cluster.rollout_urls): "
                       "serves rows over HTTP, sampling through the run's policy server")
    w.add_argument("--host", default="127.0.0.1", help="bind address (default loopback)")
    w.add_argument("--port", type=int, default=0, help="TCP port (default 0: a free one, printed)")
    w.add_argument("--api-key", help="clients must send Authorization: Bearer KEY (default: $RLVR_API_KEY, else a "
                   "key generated now, printed and written to URL_FILE.key)")
    w.add_argument("--allowed-dir", action="append", default=[], metavar="DIR",
                   help="a folder a run's setup may name files in: its tokenizer, environment or rollout files "
                        "(repeatable; default none)")
    w.add_argument("--allow-module", action="append", default=[], metavar="PKG",
                   help="a module or package a run's setup may import its factory, environment, rewards or rollout "
                        "function from (repeatable; rlvr's own package is always allowed)")
    add_origin_argument(w)
    w.add_argument("--url-file", help="write the URL here once serving (and a generated key to URL_FILE.key, "
                   "mode 600)")
    w.add_argument("--parent-pid", type=int, help="exit when this process is gone")
    w.add_argument("--max-in-flight", type=int, default=256, help="rows at once; beyond, 429 (default 256)")
    w.add_argument("--log-level", default="warning")
    w.set_defaults(func=cmd_rollout_worker)
