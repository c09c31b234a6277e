"""The process a reward worker runs (``python -m rlvr.envs.reward_worker FD``): see :mod:`rlvr.envs.workers`.

On the socket ``FD`` it receives ``(loader import path, kwargs)``, loads the environment with it
and answers ``("ready", name)`` (or ``("failed", why)`` and exits); then, per call, receives
``(messages, answer, row)`` and answers ``("ok", what the reward returned)`` or ``("raised", the
exception as text)``; ``None`` asks it to exit. A reward's output that cannot be sent back (not
picklable) is answered as ``raised``. The socket is made non-inheritable at start: a program the
reward runs (model-written code, started with ``os.system`` or ``close_fds=False``) never holds it,
so it cannot send the trainer an answer (a pickle the trainer would load) of its own. Standard
library only.
"""

from __future__ import annotations

import os
import sys
from multiprocessing.connection import Connection


def serve(conn: Connection) -> None:
    from rlvr.envs.loading import load_object
    from rlvr.errors import exception_at, exception_text
    from rlvr.reward import call_reward, name_of

    loader, kwargs = conn.recv()
    try:
        env = load_object(loader)(**kwargs)
        fn = getattr(env, "reward_fn", env)
        if not callable(fn):
            raise TypeError(f"reward_fn is {fn!r}, not a function")
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which names the spec
        conn.send(("failed", exception_text(exc)))
        return
    conn.send(("ready", str(getattr(env, "name", None) or name_of(fn, "reward"))))
    while True:
        try:
            call = conn.recv()
        except EOFError:
            return
        if call is None:
            return
        messages, answer, row = call
        try:
            answer_ = ("ok", call_reward(fn, messages, answer, row))
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the caller, named
            answer_ = ("raised", exception_at(exc))
        try:
            conn.send(answer_)
        except Exception as exc:  # noqa: BLE001 - e.g. a result that cannot be pickled
            conn.send(("raised", f"a result that cannot be sent back to the trainer: {exception_text(exc)}"))


def main(fd: int) -> None:
    os.set_inheritable(fd, False)  # pass_fds made it inheritable; the reward's programs must not get it
    serve(Connection(fd))


if __name__ == "__main__":
    main(int(sys.argv[1]))
