"""How a sandboxed run starts and ends: a chain of well-kept tools, each one exec'ing the next in the
same process, so that every limit and every isolation is in place before the interpreter starts.

The chain (``[root only]``)::

    [unshare --mount]   a private mount namespace for this run alone (gone with its processes)
    keyctl session -    a fresh, empty session keyring (nothing of the trainer's session)
    bash LAUNCHER       joins the run's cgroup; [mounts the run's scratch tmpfs with size= and
                        nr_inodes=, and makes /work, /tmp and /dev/shm in it for the sandbox uid]
    prlimit             CPU, address space, file size, open files, core, message queues[, processes]
                        for bubblewrap itself and everything under it
    [setpriv]           drops to the unprivileged uid (rlimits such as RLIMIT_NPROC hold for it)
    bwrap               new namespaces, read-only system folders, the seccomp filter, and the
                        interpreter as the PID namespace's init (no bubblewrap init inside)

Standard library and the tools above only (util-linux, keyutils, bubblewrap).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from rlvr.envs.services.sandbox_host import CgroupParent, RunCgroup, SandboxProcess, cgroup_parent, new_run_dir
from rlvr.envs.services.sandbox_seccomp import SeccompProgram, seccomp_program

NOBODY = 65534  # the uid (and gid) sandboxed code runs as when rlvr itself runs as root
SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/bin", "/sbin")  # read-only in the sandbox; nothing else of the host
SCRATCH_INODES = 4096  # files and folders in the scratch tmpfs (root only: see LAUNCHER)
NOBODY_PROCESSES = 1024  # RLIMIT_NPROC of bubblewrap as nobody: counts every nobody process of the host
CGROUP_PIDS = 16  # the launcher's short-lived mount/install, bubblewrap, the interpreter
CGROUP_SLACK_MB = 64  # memory.max beyond the address space and the scratch: page tables, kernel objects
TOOLS = {"bwrap": "bubblewrap", "prlimit": "util-linux", "keyctl": "keyutils", "bash": "bash"}
ROOT_TOOLS = {"setpriv": "util-linux", "unshare": "util-linux", "mount": "mount", "install": "coreutils"}

# bash, not sh: the fds to restore and close may have more than one digit.
# $1 stderr fd to restore (keyctl writes its keyring id there), $2 cgroup.procs or "", $3 scratch
# mount point or "", $4 scratch bytes, $5 scratch inodes, $6 sandbox uid, $7 mount, $8 install.
LAUNCHER = r"""
set -eu
eval "exec 2>&$1 $1>&-"
if [ -n "$2" ]; then echo $$ > "$2"; fi
if [ -n "$3" ]; then
    "$7" -n -t tmpfs -o "size=$4,nr_inodes=$5,mode=0711,nosuid,nodev" rlvr-sandbox "$3"
    "$8" -d -o "$6" -g "$6" -m 0700 "$3/work" "$3/tmp" "$3/shm"
fi
shift 8
exec "$@"
"""


@dataclass(frozen=True, slots=True)
class Limits:
    cpu_s: int
    memory_bytes: int
    file_bytes: int

    @property
    def scratch_bytes(self) -> int:
        return 2 * self.file_bytes  # /work, /tmp and /dev/shm together


@dataclass(frozen=True, slots=True)
class Host:
    """What runs the sandbox on this machine, found once per process by :func:`bwrap_setup`."""

    tools: dict[str, str]
    seccomp: SeccompProgram
    root: bool
    dirs: tuple[str, ...] = ()
    python: str = ""
    cgroup: CgroupParent | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a run ended, as seen from outside: the launcher's exit code (bubblewrap passes on the
    interpreter's status, ``128 + N`` for signal N; ``-N`` when the launcher itself was killed),
    the CPU seconds used, whether the wall clock ran out and whether the cgroup's memory.max killed."""

    returncode: int
    cpu_s: float
    timed_out: bool
    memory_killed: bool


def find_tools(root: bool) -> dict[str, str] | str:
    wanted = {**TOOLS, **(ROOT_TOOLS if root else {})}
    found = {name: shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/usr/bin:/sbin:/bin")
             for name in wanted}
    missing = sorted({wanted[name] for name, path in found.items() if path is None})
    if missing:
        names = ", ".join(name for name, path in found.items() if path is None)
        return f"the Python sandbox needs {names} (Debian: apt-get install {' '.join(missing)})"
    return {name: str(path) for name, path in found.items()}


def command(host: Host, limits: Limits, run_dir: str, fds: dict[str, int], cgroup: RunCgroup | None,
            inner: list[str]) -> list[str]:
    """The whole chain for one run, ending in ``inner`` (the interpreter's argv) inside bubblewrap."""
    tools = host.tools
    scratch = os.path.join(run_dir, "scratch") if host.root else ""
    chain = [tools["unshare"], "--mount", "--propagation", "private", "--"] if host.root else []
    chain += [tools["keyctl"], "session", "-", tools["bash"], "-c", LAUNCHER, "rlvr-sandbox", str(fds["stderr"]),
              cgroup.procs if cgroup else "", scratch, str(limits.scratch_bytes), str(SCRATCH_INODES), str(NOBODY),
              tools.get("mount", ""), tools.get("install", "")]
    rlimits = [f"--cpu={limits.cpu_s}:{limits.cpu_s}", f"--as={limits.memory_bytes}:{limits.memory_bytes}",
               f"--fsize={limits.file_bytes}:{limits.file_bytes}", "--nofile=64:64", "--core=0:0", "--msgqueue=0:0"]
    if host.root:
        rlimits.append(f"--nproc={NOBODY_PROCESSES}:{NOBODY_PROCESSES}")
        chain += [tools["prlimit"], *rlimits, "--", tools["setpriv"], f"--reuid={NOBODY}", f"--regid={NOBODY}",
                  "--clear-groups", "--"]
    else:
        chain += [tools["prlimit"], *rlimits, "--"]
    return [*chain, *_bwrap(host, limits, scratch, fds), *inner]


def _bwrap(host: Host, limits: Limits, scratch: str, fds: dict[str, int]) -> list[str]:
    binds = [arg for d in SYSTEM_DIRS for arg in ("--ro-bind-try", d, d)]
    binds += [arg for d in host.dirs for arg in ("--ro-bind", d, d)]
    if scratch:  # the launcher's tmpfs, bounded in bytes and in inodes
        writable = ["--bind", f"{scratch}/work", "/work", "--bind", f"{scratch}/tmp", "/tmp",
                    "--bind", f"{scratch}/shm", "/dev/shm"]
    else:  # bubblewrap's own tmpfs: bounded in bytes only (and by the cgroup where there is one)
        size = str(limits.file_bytes)
        writable = [arg for d in ("/work", "/tmp", "/dev/shm") for arg in ("--size", size, "--tmpfs", d)]
    return [host.tools["bwrap"], "--unshare-all", "--unshare-user", "--disable-userns", "--as-pid-1",
            "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--hostname", "rlvr-sandbox", *binds,
            "--proc", "/proc", "--dev", "/dev", *writable, "--remount-ro", "/dev", "--remount-ro", "/",
            "--chdir", "/work", "--clearenv", "--setenv", "HOME", "/work", "--setenv", "PATH", "/usr/bin:/bin",
            "--setenv", "LANG", "C.UTF-8", "--seccomp", str(fds["seccomp"]), "--json-status-fd", str(fds["status"]),
            "--"]


def execute(build: Callable[[dict[str, int]], list[str]], *, run_dir: str, timeout_s: float,
            seccomp: bytes | None, cgroup: RunCgroup | None) -> Outcome:
    """Runs ``build(fds)`` with stdin ``run_dir/code``, stdout ``run_dir/stdout`` and the fds named
    ``stderr`` (``run_dir/stderr``) and, isolated, ``seccomp`` (the program) and ``status``
    (bubblewrap's JSON status, which the sandboxed process never holds). Kills it at ``timeout_s``
    and reaps everything it started. The interpreter gets stdin, stdout and stderr only."""
    with contextlib.ExitStack() as stack:
        stdin = stack.enter_context(open(os.path.join(run_dir, "code"), "rb"))
        out = stack.enter_context(open(os.path.join(run_dir, "stdout"), "wb"))
        err = stack.enter_context(open(os.path.join(run_dir, "stderr"), "wb"))
        fds = {"stderr": err.fileno()}
        ours: list[int] = []
        stack.callback(_close_each, ours)
        if seccomp is not None:
            program_r, program_w = os.pipe()
            status_r, status_w = os.pipe()
            ours += [program_r, status_r, status_w]
            os.write(program_w, seccomp)  # a few KiB: well within a pipe's buffer
            os.close(program_w)
            fds.update(seccomp=program_r, status=status_w)
        isolated = seccomp is not None
        cwd = run_dir if isolated else os.path.join(run_dir, "work")
        proc = subprocess.Popen(build(fds), stdin=stdin, stdout=out, stderr=subprocess.DEVNULL if isolated else err,
                                pass_fds=tuple(fds.values()), cwd=cwd, env={}, start_new_session=True, close_fds=True)
        if isolated:
            os.close(status_w)
            ours.remove(status_w)
        watched = SandboxProcess(proc, status_r if isolated else None)
        timed_out = not watched.wait(timeout_s)
        if timed_out:
            watched.kill()
        returncode, cpu_s = watched.reap()
    memory_killed = cgroup is not None and cgroup.memory_killed()
    return Outcome(returncode, cpu_s, timed_out, memory_killed)


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


def _probe(host: Host) -> str | None:
    """Runs ``print('ok')`` through the whole chain; None if that worked, else why not."""
    run_dir = new_run_dir()
    try:
        with open(os.path.join(run_dir, "code"), "wb"):
            pass
        os.mkdir(os.path.join(run_dir, "scratch"))
        limits = Limits(cpu_s=30, memory_bytes=512 * 2**20, file_bytes=2**20)
        inner = [host.python, "-I", "-S", "-c", "print('ok')"]
        outcome = execute(lambda fds: command(host, limits, run_dir, fds, None, inner), run_dir=run_dir,
                          timeout_s=60, seccomp=host.seccomp.bpf, cgroup=None)
        with open(os.path.join(run_dir, "stdout"), "rb") as out, open(os.path.join(run_dir, "stderr"), "rb") as err:
            stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    if outcome.returncode == 0 and stdout.strip() == "ok":
        return None
    return f"{host.python}: {(stderr or stdout).strip()[:300] or f'exit status {outcome.returncode}'}"


@functools.lru_cache(maxsize=1)
def bwrap_setup() -> Host | str:
    """The sandbox's :class:`Host` here, or why the isolated sandbox cannot run. Tries this
    interpreter, then the system's ``python3`` (a root-owned install under ``/root`` is not readable
    by the unprivileged uid); probed once per process."""
    root = os.geteuid() == 0
    tools = find_tools(root)
    if isinstance(tools, str):
        return tools
    program = seccomp_program()
    if isinstance(program, str):
        return program
    parent = cgroup_parent()
    notes = [parent if isinstance(parent, str) else parent.note]
    if not root:
        notes.append("not root: the scratch tmpfs has no inode bound (nr_inodes) beyond the cgroup's memory")
    if program.unknown:
        notes.append(f"libseccomp does not know {', '.join(program.unknown)}: not filtered")
    candidates = [os.path.realpath(sys.executable)]
    system = shutil.which("python3", path="/usr/bin:/bin")
    if system and os.path.realpath(system) not in candidates:
        candidates.append(os.path.realpath(system))
    reasons = []
    for python in candidates:
        host = Host(tools, program, root, _extra_dirs(python), python,
                    None if isinstance(parent, str) else parent, tuple(n for n in notes if n))
        reason = _probe(host)
        if reason is None:
            return host
        reasons.append(reason)
    return f"bubblewrap could not start an interpreter ({'; '.join(reasons)})"


def _close_each(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)
