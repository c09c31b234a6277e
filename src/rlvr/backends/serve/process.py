"""An inference server as a child process: started on a free loopback port, waited for, always stopped.

:class:`ServerProcess` runs ``rlvr serve`` (``python -m rlvr.cli serve``) or any command template
(``{model_dir}``, ``{adapter}``, ``{port}``, ``{host}``, ``{version}``; e.g. a container), waits for
``GET /health`` with a bound, and stops it: on ``stop()``, on leaving the ``with`` block, at
interpreter exit (atexit), with SIGTERM then SIGKILL after ``stop_timeout_s``, to its whole process
group (the child starts a session of its own, so vLLM's engine process goes with it). When the parent
dies without running any of that (SIGKILL, OOM kill), ``rlvr serve --parent-pid`` notices that
its parent changed and exits on its own; a custom command must arrange its own cleanup (e.g.
``docker run --rm`` plus ``stop_command``).

The child's stdout and stderr go to a log file (never a pipe nobody reads), whose tail is quoted
when the server fails to start.

A backend module: imports httpx.
"""

from __future__ import annotations

import atexit
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx

from rlvr.errors import BackendError

_LIVE: weakref.WeakSet[ServerProcess] = weakref.WeakSet()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_healthy(url: str, timeout_s: float, *, alive=lambda: True, what: str = "server") -> float:
    """Poll ``url/health`` until 200; the seconds it took. Raises :class:`BackendError` after
    ``timeout_s`` or as soon as ``alive()`` turns false."""
    start = time.monotonic()
    deadline = start + timeout_s
    with httpx.Client(timeout=httpx.Timeout(1.0, connect=1.0)) as client:
        while True:
            if not alive():
                raise BackendError(f"{what} exited before {url}/health answered")
            try:
                if client.get(f"{url}/health").status_code == 200:
                    return time.monotonic() - start
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise BackendError(f"{what}: {url}/health did not answer 200 within {timeout_s:g}s")
            time.sleep(0.05)


class ServerProcess:
    """``with ServerProcess(model_dir) as server: HTTPGenerator(server.url, server.model_name)``."""

    def __init__(self, model_dir: str | Path, *, adapter: str | Path | None = None, host: str = "127.0.0.1",
                 port: int | None = None, device: str = "cpu", served_version: int | None = None,
                 served_model_name: str = "policy", threads: int | None = None, extra_args: Sequence[str] = (),
                 command: str | Sequence[str] | None = None, stop_command: str | Sequence[str] | None = None,
                 startup_timeout_s: float = 120.0, stop_timeout_s: float = 10.0, log_path: str | Path | None = None,
                 env: Mapping[str, str] | None = None, allowed_dirs: Sequence[str | Path] = ()):
        self.model_dir, self.adapter = str(model_dir), str(adapter) if adapter else None
        self.host, self.port, self.auto_port = host, port or free_port(host), port is None
        self.device, self.served_version, self.model_name = device, served_version, served_model_name
        self.threads, self.extra_args = threads, list(extra_args)
        self.command, self.stop_command = command, stop_command
        self.startup_timeout_s, self.stop_timeout_s = startup_timeout_s, stop_timeout_s
        self.log_path = Path(log_path) if log_path else Path(tempfile.mkdtemp(prefix="rlvr-serve-")) / "server.log"
        self.env = dict(env or {})
        self.allowed_dirs = [str(Path(d).resolve()) for d in allowed_dirs]
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def kind(self) -> str:
        return "rlvr serve process" if self.command is None else "server"

    def exit_report(self) -> str | None:
        """Why the server stopped answering, when it exited on its own: for error messages."""
        proc = self.proc
        if proc is None or proc.poll() is None:
            return None
        code = proc.returncode
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        return f"{self.kind} that rlvr started at {self.url} (pid {proc.pid}) {how}; its log: {self.log_path}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def args(self) -> list[str]:
        fields = {"model_dir": self.model_dir, "adapter": self.adapter or "", "port": self.port, "host": self.host,
                  "version": "" if self.served_version is None else self.served_version}
        if self.command is not None:
            return _render(self.command, fields)
        args = [sys.executable, "-m", "rlvr.cli", "serve", self.model_dir, "--host", self.host,
                "--port", str(self.port), "--device", self.device, "--served-model-name", self.model_name,
                "--parent-pid", str(os.getpid())]
        if self.adapter:
            args += ["--adapter", self.adapter]
        if self.served_version is not None:
            args += ["--served-version", str(self.served_version)]
        if self.threads:
            args += ["--threads", str(self.threads)]
        for folder in self.allowed_dirs:
            args += ["--allowed-dir", folder]
        return args + self.extra_args

    def start(self) -> ServerProcess:
        """Start and wait for health; on failure, stop it and raise with the log's tail."""
        if self.alive:
            raise BackendError(f"server at {self.url} is already running (pid {self.proc.pid if self.proc else '?'})")
        for attempt in range(3):
            self._spawn()
            try:
                wait_healthy(self.url, self.startup_timeout_s, alive=lambda: self.alive, what=f"server {self.url}")
                if self.alive:
                    return self
                raise BackendError(f"server {self.url} exited right after answering /health")
            except BackendError as exc:
                self.stop()
                tail = self.log_tail()
                if self.auto_port and attempt < 2 and "address already in use" in tail.lower():
                    self.port = free_port(self.host)  # lost a race for the port: take another
                    continue
                raise BackendError(f"{exc}; command: {shlex.join(self.args())}; log {self.log_path}:\n{tail}") from None
        raise AssertionError("unreachable")

    def _spawn(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.args(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, start_new_session=True)
        _LIVE.add(self)

    def stop(self) -> None:
        """Stop the server (stop command, then SIGTERM, then SIGKILL); idempotent, bounded."""
        if self.stop_command is not None and self.proc is not None:
            fields = {"model_dir": self.model_dir, "adapter": self.adapter or "", "port": self.port,
                      "host": self.host, "pid": self.proc.pid, "version": self.served_version or ""}
            try:
                subprocess.run(_render(self.stop_command, fields), timeout=self.stop_timeout_s, check=False,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            except (subprocess.TimeoutExpired, OSError):
                pass
        proc, self.proc = self.proc, None
        _LIVE.discard(self)
        if proc is None:
            return
        _signal_group(proc, signal.SIGTERM)  # also when the leader is gone: its children may not be
        try:
            proc.wait(timeout=self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            pass
        _signal_group(proc, signal.SIGKILL)
        proc.wait(timeout=self.stop_timeout_s)

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __del__(self) -> None:
        try:
            self.stop()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # the child leads its own session, so its group id is its pid
    except (ProcessLookupError, PermissionError):
        pass


def _render(template: str | Sequence[str], fields: Mapping[str, object]) -> list[str]:
    parts = shlex.split(template) if isinstance(template, str) else list(template)
    return [part.format(**fields) for part in parts]


@atexit.register
def _stop_all() -> None:
    for server in list(_LIVE):
        try:
            server.stop()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass
