"""``rlvr proxy MODEL``: the recording proxy by hand, to try an agent against a model before training it.

It renders every request with MODEL's tokenizer and chat template, samples from the model loaded in
this process (or from a server: ``--url`` of an ``rlvr serve`` or a vLLM serving the same model), and
answers in the OpenAI shapes (and Anthropic's Messages). Point an agent at
``http://127.0.0.1:PORT/s/<any-name>/v1``: every call made under that name is one episode's, stitched
into training segments as a run would. ``GET /sessions/<name>`` shows its calls, turns and segments
so far (ids and log-probs included); ``POST /sessions/<name>/close`` ends it and appends it to
``--record``. Requests sample as they ask (their temperature, ``max_tokens``, ``seed``). With
``--url`` the proxy asks the server which model it serves (``GET /v1/models``) unless
``--served-model-name`` names it. ``--chat-template FILE`` renders with that template instead of
MODEL's own; ``--tool-parser`` sets the form tool calls are read back in (default: read from the
template).

It answers only on loopback, and keeps web pages out as ``rlvr serve`` does: a foreign Host or
Origin (other origins with ``--allowed-origin``) or a body that is not JSON is refused. Chat templates
render in worker processes bounded in time and memory (``--render-timeout-s``,
``--render-memory-mb``, as ``rlvr serve``'s), so a looping template ends at its limit; SIGTERM or
Ctrl-C stops the proxy, its render workers with it, and records what it holds.
"""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path
from typing import Any

from rlvr.backends.serve.tool_calls import CHOICES
from rlvr.cli.options import add_origin_argument, add_render_arguments, render_limits
from rlvr.errors import UsageError


def add_parser(sub: Any) -> None:
    p = sub.add_parser("proxy", help="a recording OpenAI-compatible proxy in front of a model: try an agent by hand")
    p.add_argument("model", help="whose tokenizer and chat template render requests: a model folder, a hub name, a "
                   ".gguf file or gguf:package/path.gguf")
    p.add_argument("--url", help="sample from this server (rlvr serve or vLLM serving MODEL); default: load MODEL "
                   "in this process")
    p.add_argument("--served-model-name", default=None, help="the model name requests to --url use (default: the "
                   "model the server lists first at GET /v1/models)")
    p.add_argument("--chat-template", default=None, metavar="FILE", help="a Jinja chat template file to render with "
                   "instead of MODEL's own")
    p.add_argument("--tool-parser", default="auto", choices=CHOICES, help="the form tool calls are read back in "
                   "(auto: from the chat template)")
    p.add_argument("--port", type=int, default=8100, help="loopback port to listen on (0: any free port)")
    p.add_argument("--max-tokens", type=int, default=256, help="completion budget of a request that names none")
    p.add_argument("--record", default="proxy_sessions.jsonl", help="JSONL file closed sessions are appended to")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    add_render_arguments(p)
    add_origin_argument(p)
    p.set_defaults(func=cmd_proxy)


def cmd_proxy(args: argparse.Namespace) -> int:
    from rlvr.backends import require_train_extra
    from rlvr.errors import require_extra

    require_train_extra()
    require_extra("serve", "fastapi", "uvicorn", "httpx")
    from rlvr.backends.model.io import load_model, load_tokenizer
    from rlvr.backends.model.sources import is_gguf, resolve_base
    from rlvr.backends.model.tokenizer import use_chat_template
    from rlvr.backends.proxy.app import AgentProxy
    from rlvr.backends.web_guard import WebRules

    WebRules(allowed_origins=tuple(args.allowed_origin), command="rlvr proxy")  # a bad origin fails before loading
    loads = is_gguf(args.model) or Path(args.model).expanduser().is_dir()  # converted, or shadowed if it must be
    path = resolve_base(args.model).path if loads else args.model
    if Path(path).exists() and not Path(path).is_dir():
        raise UsageError(f"rlvr proxy: {args.model} is a file; give the model folder (or a .gguf file)")
    tokenizer = use_chat_template(load_tokenizer(path), args.chat_template, "--chat-template")
    if args.url:
        from rlvr.backends.sample.http import HTTPGenerator

        generator: Any = HTTPGenerator(args.url, args.served_model_name)  # None: asked at its first call
        max_len = None
    else:
        from rlvr.backends.sample.engine import InProcessEngine

        model = load_model(path, dtype=args.dtype, device=args.device)
        eos = model.generation_config.eos_token_id
        eos_ids = {*(eos if isinstance(eos, list | tuple) else [eos]), tokenizer.eos_token_id} - {None}
        generator = InProcessEngine(model, eos_ids=eos_ids, pad_id=tokenizer.pad_token_id, name="rlvr-proxy-engine")
        max_len = getattr(model.config, "max_position_embeddings", None)
    proxy = AgentProxy(tokenizer, max_len=max_len, budget=args.max_tokens, default=generator, record=args.record,
                       record_tokens=True, port=args.port, render=render_limits(args, "rlvr proxy"),
                       allowed_origins=tuple(args.allowed_origin), tool_parser=args.tool_parser)
    url = proxy.start()
    print(f"rlvr proxy: {url}/s/<episode>/v1 (OpenAI) and {url}/s/<episode> (Anthropic) -> "
          f"{args.url or 'the model in this process'}")
    print(f"  each <episode> is one session; GET {url}/sessions/<episode> shows it, POST .../close records it "
          f"to {args.record}. Ctrl-C stops.")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        for sid in proxy.book.ids():  # what was recorded is kept, whether or not it was closed
            proxy.close(sid)
        proxy.stop()
        close = getattr(generator, "close", None)
        if close is not None:
            close()
    return 0
