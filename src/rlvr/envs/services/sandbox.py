"""A sandbox for model-written Python: a child interpreter with limits; see :class:`PythonSandbox`.

Standard library only.
"""

from __future__ import annotations

import functools
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

ERROR_PREFIX = "error:"  # the first word of a failed tool's answer

# Runs in the child before any user code: limits, network/process/write guards, then the code.
# argv: cpu_s, address-space bytes, file-size bytes, the work directory.
_PRELUDE = r'''
import sys
def _rlvr_sandbox():
    import ast, builtins, io, os, resource
    cpu, mem, fsize, root = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    code = sys.stdin.buffer.read().decode("utf-8", "replace")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdin = io.StringIO("")
    sys.stdout.reconfigure(encoding="utf-8", errors="backslashreplace", line_buffering=True)
    sys.stderr.reconfigure(encoding="utf-8", errors="backslashreplace", line_buffering=True)
    for limit, value in ((resource.RLIMIT_CPU, (cpu, cpu + 1)), (resource.RLIMIT_AS, (mem, mem)),
                         (resource.RLIMIT_FSIZE, (fsize, fsize)), (resource.RLIMIT_CORE, (0, 0)),
                         (resource.RLIMIT_NOFILE, (64, 64)), (getattr(resource, "RLIMIT_NPROC", None), (0, 0))):
        if limit is not None:
            try:
                resource.setrlimit(limit, value)
            except (ValueError, OSError):
                if limit in (resource.RLIMIT_CPU, resource.RLIMIT_AS):
                    raise
    sys.dont_write_bytecode = True

    def denied(what):
        def deny(*args, **kwargs):
            raise PermissionError(f"{what} is disabled in the rlvr sandbox")
        return deny

    import socket, _socket
    class DeniedSocket(socket.socket):
        def __init__(self, *args, **kwargs):
            raise PermissionError("network access is disabled in the rlvr sandbox")
    for module in (socket, _socket):
        module.socket = module.SocketType = DeniedSocket
        for name in ("create_connection", "create_server", "socketpair", "fromfd", "getaddrinfo", "gethostbyname",
                     "gethostbyname_ex", "gethostbyaddr", "getnameinfo", "dup"):
            if hasattr(module, name):
                setattr(module, name, denied("network access"))
    for name in ("ctypes", "_ctypes"):
        sys.modules[name] = None
    import _posixsubprocess
    _posixsubprocess.fork_exec = denied("starting processes")
    for name in ("system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp", "execv", "execve", "execl",
                 "execle", "execlp", "execlpe", "execvp", "execvpe", "spawnv", "spawnve", "spawnl", "spawnle",
                 "spawnlp", "spawnlpe", "spawnvp", "spawnvpe", "kill", "killpg"):
        if hasattr(os, name):
            setattr(os, name, denied("os." + name))

    real_root = os.path.realpath(root)
    def inside(path):
        if isinstance(path, int):
            return True
        full = os.path.realpath(os.path.join(real_root, os.fsdecode(os.fspath(path))))
        return full == real_root or full.startswith(real_root + os.sep)
    def guard(path):
        if not inside(path):
            raise PermissionError(f"writing outside the sandbox directory is disabled: {path!r}")
    real_open, real_os_open = io.open, os.open
    def guarded_open(file, mode="r", *args, **kwargs):
        if any(ch in mode for ch in "wax+"):
            guard(file)
        return real_open(file, mode, *args, **kwargs)
    def guarded_os_open(path, flags, *args, **kwargs):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC):
            guard(path)
        return real_os_open(path, flags, *args, **kwargs)
    import _io
    builtins.open = io.open = _io.open = guarded_open
    os.open = guarded_os_open
    def guarded(fn, count):
        def call(*args, **kwargs):
            for path in args[:count]:
                guard(path)
            return fn(*args, **kwargs)
        return call
    for name, count in (("remove", 1), ("unlink", 1), ("rmdir", 1), ("mkdir", 1), ("makedirs", 1), ("rename", 2),
                        ("replace", 2), ("link", 2), ("symlink", 2), ("chmod", 1), ("chown", 1), ("truncate", 1),
                        ("utime", 1), ("mkfifo", 1), ("mknod", 1), ("removedirs", 1), ("renames", 2)):
        if hasattr(os, name):
            setattr(os, name, guarded(getattr(os, name), count))

    globs = {"__name__": "__main__", "__builtins__": builtins}
    try:
        tree = ast.parse(code, "<sandbox>", "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, "<sandbox>", "exec"), globs)
        if last is not None:
            value = eval(compile(last, "<sandbox>", "eval"), globs)
            if value is not None:
                print(repr(value))
    except SystemExit:
        raise
    except BaseException as exc:
        if isinstance(exc, SyntaxError):
            text = f"{exc.msg} (line {exc.lineno})"
        else:
            text = str(exc)
        sys.stdout.flush()
        sys.stderr.write(f"\nerror: {type(exc).__name__}" + (f": {text[:500]}" if text else "") + "\n")
        sys.stderr.flush()
        os._exit(1)
_rlvr_sandbox()
del _rlvr_sandbox
'''


@functools.lru_cache(maxsize=1)
def unshare_available() -> bool:
    """Whether ``unshare -rn`` (a new user + network namespace) works here; probed once."""
    path = shutil.which("unshare")
    if path is None or not sys.platform.startswith("linux"):
        return False
    try:
        out = subprocess.run([path, "-rn", sys.executable, "-I", "-S", "-c", "pass"], check=False, env={}, timeout=10,
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0


@dataclass(frozen=True, slots=True)
class SandboxResult:
    """What one sandboxed run gave. ``error`` is ``None`` on success, else an ``"error: ..."`` line."""

    output: str
    error: str | None
    exit_code: int | None
    timed_out: bool
    duration_s: float
    isolation: str

    @property
    def ok(self) -> bool:
        return self.error is None

    def content(self) -> str:
        """The tool message content: the output, then the error line, or ``"(no output)"``."""
        parts = [p for p in (self.output.rstrip("\n"), self.error) if p]
        return "\n".join(parts) if parts else "(no output)"


class PythonSandbox:
    """Runs untrusted Python in a child interpreter with limits. A best effort, not an OS sandbox.

    What each run gets:

    - a fresh interpreter ``sys.executable -I -S -B -c PRELUDE`` (isolated mode: no user site,
      no ``PYTHON*`` variables, no current directory on ``sys.path``; no ``site``), an **empty
      environment**, ``cwd`` a fresh temporary directory removed afterwards, stdin empty;
    - a **wall-clock timeout** (``timeout_s``): the whole process group is killed with SIGKILL;
    - rlimits set in the child before the user code runs: CPU time (``cpu_s``; SIGXCPU, then
      SIGKILL one second later), address space (``memory_mb``: allocations beyond it raise
      ``MemoryError``), file size (``max_file_mb``), no core dumps, 64 open files, and
      ``RLIMIT_NPROC = 0`` (no new processes or threads; the kernel ignores it for root);
    - output captured in files (bounded by the file-size limit, so a print loop cannot fill the
      parent's memory) and cut to ``max_output`` characters;
    - **network**: ``socket.socket``, ``create_connection``, ``getaddrinfo`` and friends (in both
      ``socket`` and ``_socket``) are replaced by functions raising ``PermissionError`` and
      ``ctypes`` is made unimportable, before the user code runs. This is a Python-level block:
      code that digs out the original classes (e.g. through ``__mro__``) gets around it. With
      ``network="unshare"`` (or ``"auto"``, the default, when :func:`unshare_available`) the child
      also runs under ``unshare -rn``: a new network namespace with no interfaces up, which the
      kernel enforces (loopback included);
    - **processes** (``subprocess``, ``os.system``, ``fork``, ``exec*``, ``kill``) and **writes
      outside the work directory** (``open``/``os.open`` in a writing mode, ``os.remove``,
      ``rename``, ``mkdir``...) are blocked the same Python-level way.

    The limits in the child are set by its prelude rather than in ``preexec_fn``: ``preexec_fn``
    is unsafe in a threaded parent (rollouts and the search service run in threads), and the
    prelude runs before any user code, so the effect is the same. None of this stops a determined
    attacker with a kernel or interpreter exploit; run untrusted workloads in a container or VM.
    """

    def __init__(self, *, timeout_s: float = 5.0, cpu_s: int | None = None, memory_mb: int = 512,
                 max_output: int = 2000, max_file_mb: int = 16, network: str = "auto",
                 max_code_chars: int = 100_000) -> None:
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s <= 600:
            raise ValueError(f"PythonSandbox: timeout_s must be in (0, 600], got {timeout_s!r}")
        cpu_s = max(1, math.ceil(timeout_s)) if cpu_s is None else cpu_s
        for field, value, low in (("cpu_s", cpu_s, 1), ("memory_mb", memory_mb, 64), ("max_output", max_output, 16),
                                  ("max_file_mb", max_file_mb, 1), ("max_code_chars", max_code_chars, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"PythonSandbox: {field} must be an integer >= {low}, got {value!r}")
        if network not in ("auto", "unshare", "python"):
            raise ValueError(f"PythonSandbox: network must be 'auto', 'unshare' or 'python', got {network!r}")
        if network == "unshare" and not unshare_available():
            raise RuntimeError("PythonSandbox: network='unshare' but `unshare -rn` does not work on this machine "
                               "(needs util-linux and unprivileged user namespaces); use network='auto' or 'python'")
        self.timeout_s, self.cpu_s, self.memory_mb = float(timeout_s), cpu_s, memory_mb
        self.max_output, self.max_file_mb, self.max_code_chars = max_output, max_file_mb, max_code_chars
        self.network = network

    @property
    def isolation(self) -> str:
        """``"unshare"`` when runs get their own network namespace, else ``"python"``."""
        if self.network == "python":
            return "python"
        return "unshare" if self.network == "unshare" or unshare_available() else "python"

    def __call__(self, code: str) -> str:
        return self.run(code).content()

    def run(self, code: str) -> SandboxResult:
        isolation = self.isolation
        if not isinstance(code, str):
            raise TypeError(f"PythonSandbox.run: code must be a string, got {type(code).__name__}")
        if len(code) > self.max_code_chars:
            return SandboxResult("", f"error: code longer than {self.max_code_chars} characters", None, False, 0.0,
                                 isolation)
        root = tempfile.mkdtemp(prefix="rlvr-sandbox-")
        work = os.path.join(root, "work")
        os.mkdir(work)
        prefix = [shutil.which("unshare") or "unshare", "-rn"] if isolation == "unshare" else []
        command = [*prefix, sys.executable, "-I", "-S", "-B", "-c", _PRELUDE, str(self.cpu_s),
                   str(self.memory_mb * 2**20), str(self.max_file_mb * 2**20), work]
        start = time.monotonic()
        timed_out = False
        proc: subprocess.Popen | None = None
        try:
            with open(os.path.join(root, "stdout"), "wb") as out, open(os.path.join(root, "stderr"), "wb") as err:
                proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=out, stderr=err, cwd=work, env={},
                                        start_new_session=True, close_fds=True)
                try:
                    proc.communicate(code.encode("utf-8", "replace"), timeout=self.timeout_s)
                except subprocess.TimeoutExpired:
                    timed_out = True
                    _kill_group(proc)
                    proc.communicate()
            duration = time.monotonic() - start
            stdout = _read_head(os.path.join(root, "stdout"), self.max_output)
            stderr = _read_head(os.path.join(root, "stderr"), 4000)
            error = self._error(proc.returncode, stderr, timed_out)
            return SandboxResult(stdout, error, proc.returncode, timed_out, duration, isolation)
        finally:
            if proc is not None:
                _kill_group(proc)  # anything the code left running in its group
            shutil.rmtree(root, ignore_errors=True)

    def _error(self, code: int | None, stderr: str, timed_out: bool) -> str | None:
        if timed_out:
            return f"error: TimeoutError: killed after {self.timeout_s:g}s (wall-clock limit)"
        if code == 0:
            return None
        if code is not None and code < 0:
            signum = -code
            if signum == signal.SIGXCPU:
                return f"error: TimeoutError: killed after {self.cpu_s}s of CPU time (CPU limit)"
            try:
                name = signal.Signals(signum).name
            except ValueError:
                name = str(signum)
            hint = " (CPU or memory limit)" if signum == signal.SIGKILL else ""
            return f"error: killed by signal {name}{hint}"
        lines = [line for line in stderr.splitlines() if line.strip()]
        marked = [line for line in lines if line.startswith(ERROR_PREFIX)]
        if marked:
            return marked[-1]
        tail = lines[-1][:300] if lines else ""
        return f"error: exit status {code}" + (f" ({tail})" if tail else "")


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read_head(path: str, limit: int) -> str:
    with open(path, "rb") as f:
        data = f.read(limit * 4 + 4)
        rest = os.fstat(f.fileno()).st_size - len(data)
    text = data.decode("utf-8", "replace")
    if len(text) > limit or rest > 0:
        shown = text[:limit]
        return shown + f"\n... [output truncated: {len(data) + rest} bytes in all]"
    return text
