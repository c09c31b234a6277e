"""A sandbox for model-written Python: a child interpreter isolated by the kernel; see :class:`PythonSandbox`.

Standard library only; the isolation comes from well-kept tools, chained in
:mod:`rlvr.envs.services.sandbox_launch`: bubblewrap (``bwrap``), a seccomp filter built by
libseccomp (:mod:`rlvr.envs.services.sandbox_seccomp`), util-linux (``prlimit``, ``setpriv``,
``unshare``), keyutils (``keyctl``) and, where the host gives one, a cgroup v2
(:mod:`rlvr.envs.services.sandbox_host`). ``docs/sandbox.md`` lists what holds, and where.

Invariants: a run's verdict (timeout, which limit, which signal, exit status) is decided from
outside the sandbox and carried in :class:`SandboxResult`'s fields; the code's own text (its stdout
and stderr) is never read as a verdict, and no channel but those two is open to it. Verdict lines
start with ``error: [sandbox]``, which no line the code reports about itself can start with. A run
leaves no process, no folder and no cgroup behind; folders and cgroups of a killed trainer are
removed when the next sandbox starts.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from enum import StrEnum

from rlvr.envs.services.sandbox_host import RunCgroup, new_run_dir, remove_stale
from rlvr.envs.services.sandbox_launch import (
    CGROUP_PIDS,
    CGROUP_SLACK_MB,
    NOBODY,
    SYSTEM_DIRS,
    Host,
    Limits,
    Outcome,
    bwrap_setup,
    command,
    execute,
)
from rlvr.errors import EnvError

__all__ = ["ERROR_PREFIX", "ISOLATIONS", "NOBODY", "SYSTEM_DIRS", "Limit", "PythonSandbox", "SandboxResult",
           "bwrap_available", "bwrap_setup"]

ERROR_PREFIX = "error:"  # the first word of a failed tool's answer
VERDICT = "error: [sandbox]"  # the sandbox's own verdicts; no reported exception line can start so
ISOLATIONS = ("bwrap", "unsafe_subprocess")
_REPORTED = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*(: .*)?")  # "Type" or "Type: message", one line

# Runs in the child before any user code: limits, then the code. An uncaught exception becomes one
# line, the last on stderr: the code's own text like the rest of it (anything the prelude can write,
# the code can too), shown as its error only when the run ended as such a report does (exit status 1).
# Isolation is not its job. argv: cpu_s, address-space bytes, file-size bytes, run name (for the
# host's eyes only).
_PRELUDE = r"""
import sys
def _rlvr_sandbox():
    import ast, io, os, resource
    cpu, mem, fsize = (int(arg) for arg in sys.argv[1:4])
    code = sys.stdin.buffer.read().decode("utf-8", "replace")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdin = io.StringIO("")
    sys.stdout.reconfigure(encoding="utf-8", errors="backslashreplace", line_buffering=True)
    sys.stderr.reconfigure(encoding="utf-8", errors="backslashreplace", line_buffering=True)
    for limit, value in ((resource.RLIMIT_CPU, (cpu, cpu)), (resource.RLIMIT_AS, (mem, mem)),
                         (resource.RLIMIT_FSIZE, (fsize, fsize)), (resource.RLIMIT_CORE, (0, 0)),
                         (resource.RLIMIT_NOFILE, (64, 64)), (resource.RLIMIT_NPROC, (0, 0))):
        if resource.getrlimit(limit) != value:  # isolated, the CPU limit is set outside and fixed
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
        line = type(exc).__name__ + (f": {text[:500]}" if text else "")
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        line = "\\n".join(line.splitlines())  # one line, with no line of its own after it
        os.write(2, ("\n" + line + "\n").encode("utf-8", "backslashreplace"))
        os._exit(1)
_rlvr_sandbox()
del _rlvr_sandbox
"""


def bwrap_available() -> bool:
    """Whether the bubblewrap sandbox works on this machine."""
    return not isinstance(bwrap_setup(), str)


class Limit(StrEnum):
    """Which of the run's limits the host saw it hit."""

    WALL_CLOCK = "wall_clock"  # the host killed it at ``timeout_s``
    CPU = "cpu"  # the kernel killed it at ``cpu_s`` seconds of CPU time
    MEMORY = "memory"  # the run's cgroup killed it at ``memory.max``


@dataclass(frozen=True, slots=True)
class SandboxResult:
    """What one sandboxed run gave.

    The verdict is in the fields, each decided from outside the sandbox: ``timed_out`` and ``limit``
    (the limit the host saw the run hit), ``signal`` (the signal that ended it, as its wait status
    showed), ``exit_code`` (its exit status; ``None`` when a signal ended it or it never ran) and
    ``cpu_s`` (the CPU seconds the host measured). ``output`` is the code's stdout, its own text.
    ``error`` is the line shown after it: ``None`` on success, else the sandbox's verdict
    (``"error: [sandbox] ..."``) or, for a run that exited with status 1, the exception the code
    reported as the last line of its stderr (``"error: Type: message"``: the code's own words)."""

    output: str
    error: str | None
    exit_code: int | None
    timed_out: bool
    duration_s: float
    isolation: str
    limit: Limit | None = None
    signal: str | None = None
    cpu_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None

    def content(self) -> str:
        """The tool message content: the output, then the error line, or ``"(no output)"``."""
        parts = [p for p in (self.output.rstrip("\n"), self.error) if p]
        return "\n".join(parts) if parts else "(no output)"


class PythonSandbox:
    """Runs untrusted Python isolated by the kernel (``isolation="bwrap"``, the default).

    Per run (``docs/sandbox.md`` has the full list, with what holds only as root or with a cgroup):

    - **identity**: an unprivileged uid (``nobody`` when rlvr runs as root, else the caller's own),
      no capabilities, its own user namespace in which no further one can be made; a fresh, empty
      session keyring, and no keyring system call;
    - **processes**: its own PID namespace in which the interpreter is the only process (PID 1: no
      bubblewrap init to trace or borrow), ``RLIMIT_NPROC = 0`` (no process, no thread), a seccomp
      filter denying ptrace, ``process_vm_*``, namespaces, mounts, io_uring, userfaultfd, bpf,
      perf events, SysV IPC, memfd and every exit status of 128 or more; killed from outside at the
      wall clock, with everything it started;
    - **filesystem**: ``/usr``, ``/lib*``, ``/bin``, ``/sbin`` and the interpreter read-only, ``/``
      and ``/dev`` read-only, ``/work`` (the working directory), ``/tmp`` and ``/dev/shm`` a scratch
      tmpfs of ``2 * max_file_mb`` (as root: one tmpfs of at most 4096 inodes), gone with the run;
    - **network and IPC**: its own network, IPC and UTS namespaces, and no socket but a Unix stream
      one (no TCP, UDP, raw, netlink or packet socket; no ``listen``), so that the kernel buffers it
      can fill are bounded by its open files;
    - **limits** (set before bubblewrap starts, so nothing in the run has more): CPU seconds
      (``cpu_s``, which the code cannot lower), address space (``memory_mb``), file size
      (``max_file_mb``), 64 open files, no core dumps, no message queues; where the host gives a
      cgroup v2 with those controllers, also ``memory.max`` (tmpfs, page tables and other kernel
      memory included), ``pids.max`` and one CPU, and the cgroup is killed as a whole at the end.

    What it does not do: defend against kernel or bubblewrap exploits, or hold the host's memory to
    exactly ``memory_mb`` without a cgroup (``docs/sandbox.md`` states the margin).
    ``describe()["notes"]`` says which bounds this host could not give (no cgroup v2 controllers,
    not root).

    ``isolation="unsafe_subprocess"`` runs the same child with the same rlimits but no isolation at
    all, for machines without bubblewrap where the code is trusted; it must be asked for by name.
    Without bubblewrap (or any piece of the chain) the default refuses at construction, naming what
    to install.
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
        self._host: Host | None = None
        if isolation == "bwrap":
            setup = bwrap_setup()
            if isinstance(setup, str):
                raise EnvError(f"PythonSandbox: {setup}. Model-written code is not run without isolation; "
                               "install what is named, or pass isolation='unsafe_subprocess' to run it "
                               "unisolated (only for code you trust)")
            _remove_stale_once()
            self._host = setup
            self._dirs, self._python = setup.dirs, setup.python
        else:
            self._dirs, self._python = (), sys.executable
        self.timeout_s, self.cpu_s, self.memory_mb = float(timeout_s), cpu_s, memory_mb
        self.max_output, self.max_file_mb, self.max_code_chars = max_output, max_file_mb, max_code_chars
        self.isolation = isolation
        self._limits = Limits(cpu_s, memory_mb * 2**20, max_file_mb * 2**20)

    def __call__(self, code: str) -> str:
        return self.run(code).content()

    def describe(self) -> dict[str, object]:
        host = self._host
        return {"isolation": self.isolation, "timeout_s": self.timeout_s, "cpu_s": self.cpu_s,
                "memory_mb": self.memory_mb, "max_file_mb": self.max_file_mb,
                "cgroup": sorted(host.cgroup.controllers) if host and host.cgroup else None,
                "notes": list(host.notes) if host else ["unisolated: rlimits only"]}

    def run(self, code: str) -> SandboxResult:
        if not isinstance(code, str):
            raise TypeError(f"PythonSandbox.run: code must be a string, got {type(code).__name__}")
        if len(code) > self.max_code_chars:
            return SandboxResult("", f"error: code longer than {self.max_code_chars} characters", None, False, 0.0,
                                 self.isolation)
        run_dir = new_run_dir()
        start = time.monotonic()
        try:
            with open(os.path.join(run_dir, "code"), "wb") as f:
                f.write(code.encode("utf-8", "replace"))
            os.mkdir(os.path.join(run_dir, "scratch" if self._host else "work"))
            outcome = self._execute(run_dir)
            duration = time.monotonic() - start
            stdout = _read_head(os.path.join(run_dir, "stdout"), self.max_output)
            last_line = _last_line(os.path.join(run_dir, "stderr"))
            return self._result(outcome, stdout, last_line, duration)
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)

    def _execute(self, run_dir: str) -> Outcome:
        inner = [self._python, "-I", "-S", "-B", "-c", _PRELUDE, str(self._limits.cpu_s),
                 str(self._limits.memory_bytes), str(self._limits.file_bytes)]
        label = os.path.basename(run_dir)
        host = self._host
        if host is None:
            return execute(lambda fds: [*inner, label], run_dir=run_dir,
                           timeout_s=self.timeout_s, seccomp=None, cgroup=None)
        cgroup = None
        if host.cgroup is not None:
            memory = self._limits.memory_bytes + self._limits.scratch_bytes + CGROUP_SLACK_MB * 2**20
            cgroup = RunCgroup.create(host.cgroup, memory_bytes=memory, pids=CGROUP_PIDS)
        try:
            return execute(lambda fds: command(host, self._limits, run_dir, fds, cgroup,
                                               [*inner, label]),
                           run_dir=run_dir, timeout_s=self.timeout_s, seccomp=host.seccomp.bpf, cgroup=cgroup)
        finally:
            if cgroup is not None:
                cgroup.remove()

    def _ending(self, code: int) -> tuple[int | None, int | None]:
        """``(signal, exit status)`` of the run, one of them ``None``, from the launcher's exit code:
        Popen reports a signal as ``-N``; bubblewrap passes a signal N of the interpreter on as exit
        status ``128 + N``, a status that the seccomp filter keeps the code from exiting with."""
        if code < 0:
            return -code, None
        if self.isolation == "bwrap" and 128 < code <= 128 + 64:
            return code - 128, None
        return None, code

    def _limit(self, outcome: Outcome, signum: int | None) -> Limit | None:
        if outcome.timed_out:
            return Limit.WALL_CLOCK
        if outcome.memory_killed:
            return Limit.MEMORY
        # The kernel's SIGKILL at RLIMIT_CPU, which the code cannot lower: its tick-sampled clock runs
        # a little ahead of the rusage seen here, and nothing else in the run sends SIGKILL.
        if signum in (signal.SIGKILL, signal.SIGXCPU) and outcome.cpu_s >= self.cpu_s * 0.75:
            return Limit.CPU
        return None

    def _result(self, outcome: Outcome, stdout: str, last_line: str, duration: float) -> SandboxResult:
        """The run's result: its verdict from the outcome seen outside; the code's own last stderr
        line only as the error it reported (exit status 1, no limit hit, no signal)."""
        signum, status = self._ending(outcome.returncode)
        limit = self._limit(outcome, signum)
        name = _signal_name(signum) if signum is not None else None
        if limit is Limit.WALL_CLOCK:
            error: str | None = f"{VERDICT} TimeoutError: killed after {self.timeout_s:g}s (wall-clock limit)"
        elif limit is Limit.MEMORY:
            error = f"{VERDICT} MemoryError: killed at the memory limit ({self.memory_mb} MB and the scratch)"
        elif limit is Limit.CPU:
            error = f"{VERDICT} TimeoutError: killed after {self.cpu_s}s of CPU time (CPU limit)"
        elif signum is not None:
            error = f"{VERDICT} killed by signal {name}" + (_SIGSYS_WHY if signum == signal.SIGSYS else "")
        elif status == 0:
            error = None
        elif status == 1 and _REPORTED.fullmatch(last_line):
            error = f"{ERROR_PREFIX} {last_line}"
        else:
            error = f"{VERDICT} exit status {status}" + (f" ({last_line[:300]})" if last_line else "")
        exit_code = None if limit is Limit.WALL_CLOCK else status
        return SandboxResult(stdout, error, exit_code, outcome.timed_out, duration, self.isolation, limit, name,
                             round(outcome.cpu_s, 3))


_SIGSYS_WHY = " (a system call the sandbox forbids, or an exit status of 128 or more)"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


_stale_removed = False


def _remove_stale_once() -> None:
    """Folders and cgroups a killed trainer left: removed at the first sandbox of each process."""
    global _stale_removed
    if not _stale_removed:
        _stale_removed = True
        remove_stale()


def _read_head(path: str, limit: int) -> str:
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return ""
    with f:
        data = f.read(limit * 4 + 4)
        rest = os.fstat(f.fileno()).st_size - len(data)
    text = data.decode("utf-8", "replace")
    if len(text) > limit or rest > 0:
        shown = text[:limit]
        return shown + f"\n... [output truncated: {len(data) + rest} bytes in all]"
    return text


def _last_line(path: str) -> str:
    """The last non-empty line of the file (from its last 4 KiB), as ``str.splitlines`` cuts lines."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 4096))
            tail = f.read(4096)
    except FileNotFoundError:
        return ""
    lines = [line.strip() for line in tail.decode("utf-8", "replace").splitlines() if line.strip()]
    return lines[-1] if lines else ""
