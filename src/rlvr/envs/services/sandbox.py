"""A sandbox for model-written Python: a child interpreter isolated by the kernel; see :class:`PythonSandbox`.

Standard library only; the isolation comes from bubblewrap (``bwrap``, Debian's ``bubblewrap``)
and, when rlvr runs as root, util-linux's ``setpriv`` to drop to an unprivileged uid first.
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

from rlvr.errors import EnvError

ERROR_PREFIX = "error:"  # the first word of a failed tool's answer
ISOLATIONS = ("bwrap", "unsafe_subprocess")
NOBODY = 65534  # the uid (and gid) sandboxed code runs as when rlvr itself runs as root
SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/bin", "/sbin")  # read-only in the sandbox; nothing else of the host

# Runs in the child before any user code: limits, then the code. Isolation is not its job.
# argv: cpu_s, address-space bytes, file-size bytes.
_PRELUDE = r"""
import sys
def _rlvr_sandbox():
    import ast, io, os, resource
    cpu, mem, fsize = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    code = sys.stdin.buffer.read().decode("utf-8", "replace")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdin = io.StringIO("")
    sys.stdout.reconfigure(encoding="utf-8", errors="backslashreplace", line_buffering=True)
    sys.stderr.reconfigure(encoding="utf-8", errors="backslashreplace", line_buffering=True)
    for limit, value in ((resource.RLIMIT_CPU, (cpu, cpu + 1)), (resource.RLIMIT_AS, (mem, mem)),
                         (resource.RLIMIT_FSIZE, (fsize, fsize)), (resource.RLIMIT_CORE, (0, 0)),
                         (resource.RLIMIT_NOFILE, (64, 64)), (resource.RLIMIT_NPROC, (0, 0))):
        resource.setrlimit(limit, value)
    sys.dont_write_bytecode = True
    globs = {"__name__": "__main__", "__builtins__": __builtins__}
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
        text = f"{exc.msg} (line {exc.lineno})" if isinstance(exc, SyntaxError) else str(exc)
        sys.stdout.flush()
        sys.stderr.write(f"\nerror: {type(exc).__name__}" + (f": {text[:500]}" if text else "") + "\n")
        sys.stderr.flush()
        os._exit(1)
_rlvr_sandbox()
del _rlvr_sandbox
"""


def _drop_privileges() -> list[str]:
    """``setpriv`` to an unprivileged uid when running as root (rlimits such as RLIMIT_NPROC do not
    hold for root), else nothing: the sandbox runs as the caller's own, unprivileged, uid."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise EnvError("running as root, the Python sandbox drops to an unprivileged uid with setpriv, which is "
                       "not installed (Debian: apt-get install util-linux)")
    return [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]


def _bwrap_prefix(python_dirs: tuple[str, ...], disk_bytes: int) -> list[str]:
    """bubblewrap's arguments: new user, PID, mount, network, IPC, UTS and cgroup namespaces; the
    system directories and the interpreter read-only; a size-limited tmpfs for ``/work`` and
    ``/tmp``; a fresh ``/proc`` (only the sandbox's own processes) and a minimal ``/dev``; an empty
    environment; no capabilities; killed with its parent."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise EnvError("the Python sandbox needs bubblewrap (Debian: apt-get install bubblewrap)")
    binds = [arg for d in SYSTEM_DIRS for arg in ("--ro-bind-try", d, d)]
    binds += [arg for d in python_dirs for arg in ("--ro-bind", d, d)]
    size = str(disk_bytes)
    return [*_drop_privileges(), bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--hostname", "rlvr-sandbox", *binds, "--proc", "/proc", "--dev", "/dev",
            "--size", size, "--tmpfs", "/tmp", "--size", size, "--tmpfs", "/work", "--chdir", "/work",
            "--clearenv", "--setenv", "HOME", "/work", "--setenv", "PATH", "/usr/bin:/bin",
            "--setenv", "LANG", "C.UTF-8", "--"]


def _extra_dirs(python: str) -> tuple[str, ...]:
    """Where ``python``'s standard library lives, when that is outside the system directories."""
    try:
        out = subprocess.run([python, "-I", "-S", "-c", "import sys; print(sys.base_prefix)"], check=True, env={},
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ()
    prefix = os.path.realpath(out.stdout.strip())
    inside = any(prefix == d or prefix.startswith(d + "/") for d in SYSTEM_DIRS)
    return () if inside or not prefix else (prefix,)


@functools.lru_cache(maxsize=1)
def bwrap_setup() -> tuple[tuple[str, ...], str] | str:
    """``(directories to bind, interpreter)`` that run inside the bubblewrap sandbox here, or why
    none does. Tries this interpreter, then the system's ``python3`` (a root-owned install under
    ``/root`` is not readable by the unprivileged uid); probed once per process."""
    candidates = [os.path.realpath(sys.executable)]
    system = shutil.which("python3", path="/usr/bin:/bin")
    if system and os.path.realpath(system) not in candidates:
        candidates.append(os.path.realpath(system))
    reason = "no interpreter ran"
    for python in candidates:
        dirs = _extra_dirs(python)
        try:
            command = [*_bwrap_prefix(dirs, 2**20), python, "-I", "-S", "-c", "print('ok')"]
        except EnvError as exc:
            return str(exc)
        try:
            out = subprocess.run(command, capture_output=True, text=True, timeout=60, env={})
        except (OSError, subprocess.SubprocessError) as exc:
            reason = f"{python}: {exc}"
            continue
        if out.returncode == 0 and out.stdout.strip() == "ok":
            return dirs, python
        reason = f"{python}: {(out.stderr or out.stdout).strip()[:300] or f'exit status {out.returncode}'}"
    return f"bubblewrap could not start an interpreter ({reason})"


def bwrap_available() -> bool:
    """Whether the bubblewrap sandbox works on this machine."""
    return not isinstance(bwrap_setup(), str)


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
    """Runs untrusted Python isolated by the kernel (``isolation="bwrap"``, the default).

    What is isolated, per run, by bubblewrap (and ``setpriv`` when rlvr runs as root):

    - **identity**: an unprivileged uid (``nobody`` when rlvr runs as root, else the caller's own),
      no capabilities, its own user namespace; ``RLIMIT_NPROC = 0``, which holds for a non-root uid:
      no new processes or threads, so no fork bomb and no shell;
    - **processes**: its own PID namespace with a fresh ``/proc``: no other process is visible, so
      none can be signalled, traced or read (``/proc/<pid>/environ`` of the trainer included);
      when the run ends or times out, killing the sandbox's init kills everything in it;
    - **filesystem**: its own mount namespace holding only ``/usr``, ``/lib*``, ``/bin``, ``/sbin``
      and the interpreter, read-only, plus ``/work`` (the working directory) and ``/tmp`` as
      tmpfs of ``max_file_mb`` each, gone with the run: nothing of the host can be written, and no
      file outside those directories can be read (no home, no ``/etc``, no run folder);
    - **network and IPC**: its own network namespace (loopback only, nothing listening), IPC and
      UTS namespaces; abstract and path Unix sockets of the host are out of reach;
    - **environment**: empty (``HOME=/work``, ``PATH``, ``LANG`` only); the interpreter runs in
      isolated mode (``-I -S -B``);
    - **limits**: CPU seconds (``cpu_s``), address space (``memory_mb``), file size
      (``max_file_mb``), 64 open files, no core dumps, and a wall-clock kill (``timeout_s``).

    What it does not do: defend against kernel or bubblewrap exploits, or limit the CPU or memory
    of the *host* beyond the rlimits above (no cgroups). For hostile workloads at scale, add a VM
    or a container runtime around the whole trainer.

    ``isolation="unsafe_subprocess"`` runs the same child with the same rlimits but no isolation at
    all, for machines without bubblewrap where the code is trusted; it must be asked for by name.
    Without bubblewrap the default refuses at construction, naming what to install.
    """

    def __init__(self, *, timeout_s: float = 5.0, cpu_s: int | None = None, memory_mb: int = 512,
                 max_output: int = 2000, max_file_mb: int = 16, isolation: str = "bwrap",
                 max_code_chars: int = 100_000) -> None:
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s <= 600:
            raise ValueError(f"PythonSandbox: timeout_s must be in (0, 600], got {timeout_s!r}")
        cpu_s = max(1, math.ceil(timeout_s)) if cpu_s is None else cpu_s
        for field, value, low in (("cpu_s", cpu_s, 1), ("memory_mb", memory_mb, 64), ("max_output", max_output, 16),
                                  ("max_file_mb", max_file_mb, 1), ("max_code_chars", max_code_chars, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"PythonSandbox: {field} must be an integer >= {low}, got {value!r}")
        if isolation not in ISOLATIONS:
            raise ValueError(f"PythonSandbox: isolation must be one of {ISOLATIONS}, got {isolation!r}")
        if isolation == "bwrap":
            setup = bwrap_setup()
            if isinstance(setup, str):
                raise EnvError(f"PythonSandbox: {setup}. Model-written code is not run without isolation; "
                               "install bubblewrap, or pass isolation='unsafe_subprocess' to run it unisolated "
                               "(only for code you trust)")
            self._dirs, self._python = setup
        else:
            self._dirs, self._python = (), sys.executable
        self.timeout_s, self.cpu_s, self.memory_mb = float(timeout_s), cpu_s, memory_mb
        self.max_output, self.max_file_mb, self.max_code_chars = max_output, max_file_mb, max_code_chars
        self.isolation = isolation

    def __call__(self, code: str) -> str:
        return self.run(code).content()

    def describe(self) -> dict[str, object]:
        return {"isolation": self.isolation, "timeout_s": self.timeout_s, "cpu_s": self.cpu_s,
                "memory_mb": self.memory_mb, "max_file_mb": self.max_file_mb}

    def _command(self) -> list[str]:
        limits = [str(self.cpu_s), str(self.memory_mb * 2**20), str(self.max_file_mb * 2**20)]
        prefix = _bwrap_prefix(self._dirs, self.max_file_mb * 2**20) if self.isolation == "bwrap" else []
        return [*prefix, self._python, "-I", "-S", "-B", "-c", _PRELUDE, *limits]

    def run(self, code: str) -> SandboxResult:
        if not isinstance(code, str):
            raise TypeError(f"PythonSandbox.run: code must be a string, got {type(code).__name__}")
        if len(code) > self.max_code_chars:
            return SandboxResult("", f"error: code longer than {self.max_code_chars} characters", None, False, 0.0,
                                 self.isolation)
        root = tempfile.mkdtemp(prefix="rlvr-sandbox-")  # the parent's: output files, and cwd when unisolated
        work = os.path.join(root, "work")
        os.mkdir(work)
        start = time.monotonic()
        timed_out = False
        proc: subprocess.Popen | None = None
        try:
            with open(os.path.join(root, "stdout"), "wb") as out, open(os.path.join(root, "stderr"), "wb") as err:
                proc = subprocess.Popen(self._command(), stdin=subprocess.PIPE, stdout=out, stderr=err, cwd=work,
                                        env={}, start_new_session=True, close_fds=True)
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
            return SandboxResult(stdout, error, proc.returncode, timed_out, duration, self.isolation)
        finally:
            if proc is not None:
                _kill_group(proc)  # anything the code left running in its group
            shutil.rmtree(root, ignore_errors=True)

    def _signal_of(self, code: int | None) -> int | None:
        """The signal that killed the child, if one did: Popen reports it as ``-N``, bubblewrap
        (whose init waits for the child) as exit status ``128 + N``."""
        if code is not None and code < 0:
            return -code
        if code is not None and code > 128 and self.isolation == "bwrap":
            return code - 128
        return None

    def _error(self, code: int | None, stderr: str, timed_out: bool) -> str | None:
        if timed_out:
            return f"error: TimeoutError: killed after {self.timeout_s:g}s (wall-clock limit)"
        if code == 0:
            return None
        signum = self._signal_of(code)
        if signum is not None:
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
