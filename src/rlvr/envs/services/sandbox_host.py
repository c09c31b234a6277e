"""The host side of the Python sandbox: its run folders, its cgroup, and the processes of one run,
watched, killed and reaped from outside.

Invariants kept here:

- every run folder and run cgroup is named ``rlvr-sandbox-<pid>.<start time>-...`` after the process
  that made it; one whose owner is gone (a trainer that was killed) is removed the next time a
  sandbox starts in any process (:func:`remove_stale`);
- a run's processes are killed from outside: the sandboxed process by a pidfd that bubblewrap's
  status names (the sandbox's PID-namespace init, so everything in it dies with it), then
  bubblewrap, then the run's cgroup as a whole; bubblewrap is never killed before its child, so it
  is the one that reaps it, and when it cannot (killed itself), the child is reaped here through
  its pidfd if it was handed to this process (as it is when the trainer is PID 1);
- nothing else is ever waited for: the reaping is by pidfd or by this run's own pid, never ``-1``.
"""

from __future__ import annotations

import functools
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time

PREFIX = "rlvr-sandbox-"
CONTROLLERS = ("memory", "pids", "cpu")


# ------------------------------------------------------------------------------- owners and folders


def _start_time(pid: int) -> str | None:
    """Field 22 of ``/proc/PID/stat`` (start time in clock ticks), which tells a pid from its reuse."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[19].decode()


def owner_token() -> str:
    return f"{os.getpid()}.{_start_time(os.getpid())}"


def _owner_gone(name: str) -> bool:
    """Whether the process named in ``rlvr-sandbox-<pid>.<start>-...`` has exited."""
    token = name[len(PREFIX):].split("-", 1)[0]
    pid, _, start = token.partition(".")
    if not pid.isdigit() or not start.isdigit():
        return False  # not a name of this form: not ours to remove
    return _start_time(int(pid)) != start


def _traversable(path: str) -> bool:
    """Whether any uid may pass through every folder down to ``path`` (the sandbox's uid binds
    its scratch from there) and this process may write it."""
    if not os.access(path, os.W_OK | os.X_OK):
        return False
    path = os.path.realpath(path)
    while True:
        try:
            if not os.stat(path).st_mode & 0o001:
                return False
        except OSError:
            return False
        if path == "/":
            return True
        path = os.path.dirname(path)


def run_bases() -> list[str]:
    """Where run folders may go: the temporary folder, then the usual world-writable ones."""
    found = []
    for base in (tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm"):
        if base not in found and os.path.isdir(base):
            found.append(base)
    return found


def new_run_dir() -> str:
    """A fresh run folder: the parent's files, and the mount point of the run's scratch tmpfs, in
    the first of :func:`run_bases` that every uid can pass through (or the temporary folder).
    Mode 0711: the sandbox's unprivileged uid may pass through it, not list or write it."""
    base = next((b for b in run_bases() if _traversable(b)), tempfile.gettempdir())
    path = tempfile.mkdtemp(prefix=f"{PREFIX}{owner_token()}-", dir=base)
    os.chmod(path, 0o711)
    return path


def remove_stale() -> list[str]:
    """Removes the run folders and run cgroups that a killed process left behind; returns them."""
    removed = []
    for base in run_bases():
        for name in _listdir(base):
            if name.startswith(PREFIX) and _owner_gone(name):
                shutil.rmtree(os.path.join(base, name), ignore_errors=True)
                removed.append(os.path.join(base, name))
    parent = cgroup_parent()
    if not isinstance(parent, str):
        for name in _listdir(parent.path):
            if name.startswith(PREFIX) and _owner_gone(name):
                RunCgroup(os.path.join(parent.path, name), parent.controllers).remove()
                removed.append(os.path.join(parent.path, name))
    return removed


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


# ------------------------------------------------------------------------------------------ cgroups


class CgroupParent:
    """Where run cgroups are made (this process's own cgroup v2) and which controllers they get."""

    def __init__(self, path: str, controllers: frozenset[str], note: str) -> None:
        self.path, self.controllers, self.note = path, controllers, note


def _cgroup2_mount() -> str | None:
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                if right.split()[:1] == ["cgroup2"] and left.split()[3] == "/":
                    return left.split()[4]
    except OSError:
        pass
    return None


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


@functools.lru_cache(maxsize=1)
def cgroup_parent() -> CgroupParent | str:
    """This process's cgroup v2 folder, with the controllers its children can have, or why runs
    get no cgroup here. Enables ``memory``, ``pids`` and ``cpu`` for its children where the kernel
    lets it (not in a cgroup that holds processes itself, unless it is the root)."""
    mount = _cgroup2_mount()
    if mount is None:
        return "no cgroup v2 is mounted"
    try:
        own = next(line[3:].strip() for line in _read("/proc/self/cgroup").splitlines() if line.startswith("0::"))
    except (OSError, StopIteration):
        return "this process is in no cgroup v2"
    path = os.path.join(mount, own.lstrip("/")).rstrip("/")
    if not os.access(path, os.W_OK):
        return f"the cgroup v2 folder {path} is not writable here"
    try:
        available = set(_read(os.path.join(path, "cgroup.controllers")).split())
        for controller in set(CONTROLLERS) & available:
            try:
                _write(os.path.join(path, "cgroup.subtree_control"), f"+{controller}")
            except OSError:
                pass
        enabled = frozenset(set(_read(os.path.join(path, "cgroup.subtree_control")).split()) & set(CONTROLLERS))
    except OSError as exc:
        return f"the cgroup v2 folder {path} cannot be read ({exc})"
    missing = [c for c in CONTROLLERS if c not in enabled]
    note = "" if not missing else (f"cgroup v2 at {path} gives runs no {', '.join(missing)} controller (available "
                                   f"there: {' '.join(sorted(available)) or 'none'}); those bounds come from rlimits")
    return CgroupParent(path, enabled, note)


class RunCgroup:
    """One run's cgroup: its processes join it before bubblewrap starts; killed and removed as a whole."""

    def __init__(self, path: str, controllers: frozenset[str]) -> None:
        self.path, self.controllers = path, controllers

    @classmethod
    def create(cls, parent: CgroupParent, *, memory_bytes: int, pids: int, cpus: float = 1.0) -> RunCgroup:
        path = tempfile.mkdtemp(prefix=f"{PREFIX}{owner_token()}-", dir=parent.path)
        run = cls(path, parent.controllers)
        limits = {"memory": [("memory.max", str(memory_bytes)), ("memory.swap.max", "0"), ("memory.oom.group", "1")],
                  "pids": [("pids.max", str(pids))], "cpu": [("cpu.max", f"{int(cpus * 100_000)} 100000")]}
        for controller in parent.controllers:
            for name, value in limits[controller]:
                if os.path.exists(os.path.join(path, name)):
                    _write(os.path.join(path, name), value)
        return run

    @property
    def procs(self) -> str:
        return os.path.join(self.path, "cgroup.procs")

    def memory_killed(self) -> bool:
        """Whether the kernel killed something here at ``memory.max``."""
        try:
            events = dict(line.split() for line in _read(os.path.join(self.path, "memory.events")).splitlines())
        except (OSError, ValueError):
            return False
        return int(events.get("oom_kill", 0)) > 0

    def kill(self) -> None:
        """SIGKILL to everything in it: ``cgroup.kill`` (Linux 5.14), else each process it lists."""
        try:
            _write(os.path.join(self.path, "cgroup.kill"), "1")
            return
        except FileNotFoundError:
            pass
        except OSError:
            return
        try:
            pids = [int(p) for p in _read(self.procs).split()]
        except OSError:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def remove(self) -> None:
        """Kills whatever is left in it, waits for it to empty (up to 2 s) and removes it."""
        deadline = time.monotonic() + 2.0
        while True:
            self.kill()
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    return  # left for remove_stale
                time.sleep(0.01)


# ----------------------------------------------------------------------------------------- processes


class SandboxProcess:
    """One launched run: ``proc`` (the launcher, which ends as bubblewrap, or the bare interpreter
    when unisolated) and, once bubblewrap's JSON status names it, the sandboxed process itself."""

    def __init__(self, proc: subprocess.Popen, status_fd: int | None) -> None:
        self.proc = proc
        self._pidfd = os.pidfd_open(proc.pid)
        self._status_fd, self._status = status_fd, b""
        self._child: int | None = None  # a pidfd of the sandboxed process

    def wait(self, timeout: float) -> bool:
        """Waits until the launcher exits (True) or ``timeout`` passes (False), noting the child."""
        deadline = time.monotonic() + timeout
        poller = select.poll()
        poller.register(self._pidfd, select.POLLIN)
        if self._status_fd is not None:
            poller.register(self._status_fd, select.POLLIN)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            for fd, _ in poller.poll(left * 1000):
                if fd == self._pidfd:
                    return True
                if not self._read_status():
                    poller.unregister(fd)

    def _read_status(self) -> bool:
        """Reads bubblewrap's status; pins the child by a pidfd once named. False at end of file."""
        assert self._status_fd is not None  # read only while it is polled
        chunk = os.read(self._status_fd, 4096)
        self._status += chunk
        if self._child is None and b"\n" in self._status:
            try:
                pid = int(json.loads(self._status.split(b"\n", 1)[0])["child-pid"])
                child = os.pidfd_open(pid)
            except (ValueError, KeyError, TypeError, OSError):
                return bool(chunk)
            if _parent_of(pid) == self.proc.pid:  # still bubblewrap's child, so the pidfd is the right process
                self._child = child
            else:
                os.close(child)
        return bool(chunk)

    def kill(self) -> None:
        """Kills the sandboxed process first (its PID namespace with it), then the launcher if it
        has not exited within 2 s of that."""
        if self._status_fd is not None and self._child is None:
            ready = select.select([self._status_fd], [], [], 0)[0]
            if ready:
                self._read_status()
        if self._child is not None:
            try:
                signal.pidfd_send_signal(self._child, signal.SIGKILL)
            except ProcessLookupError:
                pass
            if self.wait(2.0):
                return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: start_new_session
        except (ProcessLookupError, PermissionError):
            pass

    def reap(self) -> tuple[int, float]:
        """Waits for the launcher; returns its exit code (``-N`` for signal N) and the CPU seconds
        it and the processes it reaped used. Reaps the sandboxed process too if it was handed to
        this process. Closes the pidfds."""
        _, status, usage = os.wait4(self.proc.pid, 0)
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        if self._child is not None:
            try:  # handed to this process only if bubblewrap died first (as when the trainer is PID 1)
                if os.waitid(os.P_PIDFD, self._child, os.WEXITED | os.WNOHANG) is None:
                    select.select([self._child], [], [], 1.0)  # killed already: gone within moments
                    os.waitid(os.P_PIDFD, self._child, os.WEXITED | os.WNOHANG)
            except ChildProcessError:
                pass  # bubblewrap reaped it, as it should
            os.close(self._child)
            self._child = None
        os.close(self._pidfd)
        return self.proc.returncode, usage.ru_utime + usage.ru_stime


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None
