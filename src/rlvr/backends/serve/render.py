"""Chat templates rendered and prompts tokenized off the event loop, in bounded worker processes.

A request's ``chat_template`` is code (Jinja) run on the server: ``{{ 'a' * 200000000 }}`` is a
200-byte request that allocates gigabytes, a nested loop one that never ends. So rendering and
tokenizing run in :class:`RenderPool`'s worker processes (``workers`` of them and a spare, each a
fresh interpreter holding a pickled copy of the tokenizer), never on the server's event loop, and each
job is bounded three ways: the template's length (checked before it is sent), the rendered text's
length (checked before it is tokenized), and time (a worker that runs past ``timeout_s`` is killed
and replaced); each worker's address space is capped at its size after start-up plus
``memory_mb``, so a memory bomb ends in ``MemoryError``. Every refusal is a :class:`RequestError`
naming the limit and the flag that sets it (``rlvr serve``'s, or ``rlvr proxy``'s: the same pool
renders its requests).

Invariant: a job renders exactly as ``tokenizer.apply_chat_template(..., tokenize=False)`` then
``tokenizer(text, add_special_tokens=...)`` would in the server process (the same tokenizer,
pickled); the clients other than the one whose job is slow keep being served, because the event
loop only waits on a pipe.

A backend module: imports transformers in the workers only.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import resource
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from rlvr.errors import BackendError, RequestError

START_TIMEOUT_S = 120.0  # a worker imports transformers and unpickles the tokenizer


@dataclass(frozen=True)
class RenderLimits:
    """Bounds on one rendering job (see the module docstring); flags of ``command`` (``rlvr serve``,
    ``rlvr proxy``), which refusals name."""

    workers: int = 2
    timeout_s: float = 10.0
    memory_mb: int = 1024
    max_template_chars: int = 1 << 16
    max_prompt_chars: int = 1 << 20
    command: str = "rlvr serve"


# ---- the worker process ---------------------------------------------------------------------------
def _cap_memory(extra_mb: int) -> None:
    with open("/proc/self/statm") as f:
        size = int(f.read().split()[0]) * resource.getpagesize()
    cap = size + extra_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


def _worker_main(inbox: Connection, outbox: Connection, memory_mb: int) -> None:
    tokenizer = pickle.loads(inbox.recv_bytes())
    tokenizer("warm up")  # lazily built state is allocated before the cap
    try:
        _cap_memory(memory_mb)
    except (OSError, ValueError):  # no /proc, or a cap the host refuses: time and length still bound a job
        pass
    outbox.send(("ready",))
    while True:
        try:
            job = inbox.recv()
        except EOFError:
            return
        try:
            outbox.send(("ok", _do(tokenizer, job)))
        except RequestError as exc:
            outbox.send(("refused", exc.message, exc.param, exc.status))
        except MemoryError:
            outbox.send(("refused", f"rendering or tokenizing went over {memory_mb} MB "
                       f"({job.get('command', 'rlvr serve')} --render-memory-mb)", job.get("field"), 413))


def _do(tokenizer: Any, job: dict[str, Any]) -> Any:
    limit = job["max_chars"]
    if job["kind"] == "texts":
        return [list(tokenizer(t, add_special_tokens=job["add_special_tokens"])["input_ids"]) for t in job["texts"]]
    try:
        text = tokenizer.apply_chat_template(job["messages"], tools=job["tools"], chat_template=job["chat_template"],
                                             tokenize=False, **job["options"])
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - any template failure is the request's fault: a 400
        raise RequestError(f"messages could not be rendered with the chat template: {exc}", job["field"]) from None
    if not isinstance(text, str):
        raise RequestError("the chat template did not render text", job["field"])
    if len(text) > limit:
        raise RequestError(f"the rendered prompt has {len(text)} characters, over the limit of {limit} "
                           f"({job.get('command', 'rlvr serve')} --max-prompt-chars)", job["field"], 413)
    return list(tokenizer(text, add_special_tokens=job["add_special_tokens"])["input_ids"])


# ---- the pool, on the server's side ------------------------------------------------------------------
class _Worker:
    """A ``python -m rlvr.backends.serve.render`` process (a fresh interpreter: nothing of the
    server's threads or of its ``__main__`` is inherited), spoken to over two pipes."""

    def __init__(self, tokenizer_bytes: bytes, memory_mb: int):
        down_r, down_w = os.pipe()
        up_r, up_w = os.pipe()
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}  # one thread: the memory cap counts every stack
        self.process = subprocess.Popen([sys.executable, "-m", "rlvr.backends.serve.render", str(down_r), str(up_w),
                                         str(memory_mb)], pass_fds=(down_r, up_w), env=env, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL)
        os.close(down_r)
        os.close(up_w)
        self.inbox, self.conn = Connection(down_w, readable=False), Connection(up_r, writable=False)
        self.inbox.send_bytes(tokenizer_bytes)
        self.ready = False

    def run(self, job: dict[str, Any], timeout_s: float) -> tuple:
        if not self.ready:
            if not self.conn.poll(START_TIMEOUT_S):
                raise BackendError(f"a render worker did not start within {START_TIMEOUT_S:.0f} s")
            self.conn.recv()
            self.ready = True
        self.inbox.send(job)
        if not self.conn.poll(timeout_s):
            raise TimeoutError
        return self.conn.recv()

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(timeout=5)
        self.conn.close()
        self.inbox.close()


class RenderPool:
    """``workers`` processes; a job waits for a free one (first come), and runs under the limits."""

    def __init__(self, tokenizer: Any, limits: RenderLimits):
        self.limits = limits
        self._tokenizer = pickle.dumps(tokenizer)
        self._local = threading.local()
        self._workers: list[_Worker] = []
        self._guard = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=limits.workers, thread_name_prefix="rlvr-render")
        self._closed = False
        # Started now (they load in the background): one per thread, and a spare that takes over at
        # once from a worker killed at the time limit (a fresh one takes seconds to load).
        for _ in range(limits.workers + 1):
            self._workers.append(self._new())
        self._spare = list(self._workers)

    def _new(self) -> _Worker:
        return _Worker(self._tokenizer, self.limits.memory_mb)

    def _run(self, job: dict[str, Any]) -> Any:
        worker = getattr(self._local, "worker", None)
        if worker is None:
            with self._guard:
                if self._closed:
                    raise RequestError("the server is stopping", job["field"], 503)
                worker = self._local.worker = self._spare.pop() if self._spare else self._new()
        try:
            answer = worker.run(job, self.limits.timeout_s)
        except (TimeoutError, EOFError, OSError, BrokenPipeError) as exc:
            worker.kill()  # the job is abandoned with its process; a fresh one starts loading now
            with self._guard:
                if self._closed:  # the server is stopping: its workers were killed, none replaces them
                    raise RequestError("the server is stopping", job["field"], 503) from None
                self._workers.remove(worker)
                self._local.worker = self._spare.pop() if self._spare else None
                self._spare.append(self._new())
                self._workers.append(self._spare[-1])
            if isinstance(exc, TimeoutError):
                raise RequestError(f"rendering took over {self.limits.timeout_s:g} s "
                                   f"({self.limits.command} --render-timeout-s)", job["field"], 413) from None
            raise RequestError(f"the render worker died on this request ({type(exc).__name__})", job["field"],
                               413) from None
        if answer[0] == "refused":
            raise RequestError(answer[1], answer[2], answer[3])
        return answer[1]

    async def run(self, job: dict[str, Any]) -> Any:
        job = {**job, "command": self.limits.command}
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._run, job)

    async def chat(self, messages: list[dict[str, Any]], *, tools: Any, chat_template: str | None, field: str,
                   options: dict[str, Any], add_special_tokens: bool) -> list[int]:
        limit = self.limits.max_template_chars
        if chat_template is not None and len(chat_template) > limit:
            raise RequestError(f"chat_template has {len(chat_template)} characters, over the limit of {limit} "
                               f"({self.limits.command} --max-template-chars)", "chat_template", 413)
        return await self.run({"kind": "chat", "messages": messages, "tools": tools, "chat_template": chat_template,
                               "options": options, "add_special_tokens": add_special_tokens, "field": field,
                               "max_chars": self.limits.max_prompt_chars})

    async def texts(self, texts: list[str], *, add_special_tokens: bool, field: str) -> list[list[int]]:
        for text in texts:
            if len(text) > self.limits.max_prompt_chars:
                raise RequestError(f"{field} has {len(text)} characters, over the limit of "
                                   f"{self.limits.max_prompt_chars} ({self.limits.command} --max-prompt-chars)",
                                   field, 413)
        return await self.run({"kind": "texts", "texts": texts, "add_special_tokens": add_special_tokens,
                               "field": field, "max_chars": self.limits.max_prompt_chars})

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        with self._guard:
            self._closed = True
            for worker in self._workers:
                worker.kill()
            self._workers.clear()


class InlineRenderer:
    """:class:`RenderPool`'s interface, rendering in a thread of this process: the length limits hold,
    time and memory are not bounded. For prompts from programs the run itself starts (the recording
    proxy's agents), never for requests from the network at large."""

    def __init__(self, tokenizer: Any, limits: RenderLimits = RenderLimits()):
        self.tokenizer, self.limits = tokenizer, limits

    async def chat(self, messages: list[dict[str, Any]], *, tools: Any, chat_template: str | None, field: str,
                   options: dict[str, Any], add_special_tokens: bool) -> list[int]:
        job = {"kind": "chat", "messages": messages, "tools": tools, "chat_template": chat_template,
               "options": options, "add_special_tokens": add_special_tokens, "field": field,
               "max_chars": self.limits.max_prompt_chars}
        return await asyncio.to_thread(_do, self.tokenizer, job)


if __name__ == "__main__":  # a worker: python -m rlvr.backends.serve.render IN_FD OUT_FD MEMORY_MB
    for _fd in sys.argv[1:3]:
        os.set_inheritable(int(_fd), False)  # the pipes stay this process's: no child of its answers the server
    _worker_main(Connection(int(sys.argv[1]), writable=False), Connection(int(sys.argv[2]), readable=False),
                 int(sys.argv[3]))
