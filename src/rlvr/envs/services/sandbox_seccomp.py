"""The Python sandbox's seccomp filter: the system calls sandboxed code may not make, as the BPF
program that bubblewrap loads (``bwrap --seccomp FD``) right before it runs the interpreter.

The program is built by libseccomp, through its own Python bindings (module ``seccomp``; Debian:
``python3-seccomp``), in a child interpreter that has them: this one if it can import ``seccomp``,
else the system's ``python3``. It is built once per process and kept as bytes.

What the program keeps invariant (see :data:`DENIED` for the reason of each group):

- every call named in :data:`DENIED` fails with ``EPERM``, whatever its arguments;
- ``clone`` with any namespace flag, ``socket``/``socketpair`` of any family but Unix, IPv4, IPv6
  and netlink, ``prctl(PR_SET_PDEATHSIG)`` and the terminal-injecting ``ioctl``\\ s fail with ``EPERM``;
  ``clone3`` fails with ``ENOSYS`` (its flags sit in memory a filter cannot read; libc then falls back
  to ``clone``, whose flags it can);
- a system call of another architecture (32-bit ``int 0x80`` on x86-64, for one) kills the process:
  libseccomp's default for a foreign architecture;
- everything else is allowed: the filter narrows the kernel's surface, the namespaces, the uid and
  the limits do the rest.
"""

from __future__ import annotations

import base64
import functools
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

DENIED: dict[str, tuple[str, ...]] = {
    # Another process's memory or execution (the sandbox's own init, the trainer's other sandboxes).
    "other processes": ("ptrace", "process_vm_readv", "process_vm_writev", "process_madvise", "pidfd_getfd",
                        "kcmp"),
    # Kernel keyrings outlive the run and can be shared with the trainer's session.
    "keyrings": ("keyctl", "add_key", "request_key"),
    # Nested namespaces bring their own unbounded tmpfs and a root that could remount.
    "namespaces and mounts": ("unshare", "setns", "mount", "umount2", "umount", "pivot_root", "chroot", "fsopen",
                              "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr"),
    # Large kernel surfaces that model-written Python never needs.
    "kernel surface": ("io_uring_setup", "io_uring_enter", "io_uring_register", "userfaultfd", "perf_event_open",
                       "bpf", "fanotify_init", "open_by_handle_at", "lookup_dcookie", "vhangup"),
    # Memory that the address-space limit does not count: SysV IPC, memfd, POSIX message queues.
    "memory outside the limits": ("memfd_create", "memfd_secret", "shmget", "shmat", "shmctl", "msgget", "msgsnd",
                                  "msgrcv", "msgctl", "semget", "semctl", "semop", "semtimedop", "mq_open"),
    # Host-wide state; these need capabilities the sandbox lacks, and are denied all the same.
    "host state": ("kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot",
                   "swapon", "swapoff", "acct", "quotactl", "quotactl_fd", "syslog", "settimeofday",
                   "clock_settime", "clock_adjtime", "adjtimex", "sethostname", "setdomainname", "iopl", "ioperm",
                   "migrate_pages", "move_pages"),
}
# Must be known to libseccomp, else the sandbox refuses to run (the rest is denied where known).
REQUIRED = ("ptrace", "process_vm_readv", "process_vm_writev", "keyctl", "add_key", "request_key", "unshare",
            "setns", "mount", "umount2", "pivot_root", "io_uring_setup", "io_uring_enter", "io_uring_register",
            "userfaultfd", "perf_event_open", "bpf", "memfd_create", "shmget", "clone", "clone3", "socket", "prctl")
SOCKET_FAMILIES = {"AF_UNIX": 1, "AF_INET": 2, "AF_INET6": 10, "AF_NETLINK": 16}  # the only ones allowed
AF_MAX = 46  # one past the highest address family Linux defines (AF_MCTP = 45)
CLONE_NAMESPACE_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)
PR_SET_PDEATHSIG = 1  # a cleared parent-death signal would let the code outlive a killed trainer
TERMINAL_IOCTLS = (0x5412, 0x541C)  # TIOCSTI, TIOCLINUX: type into a terminal

# Runs in a child interpreter that has libseccomp's bindings; argv[1] is the JSON spec below.
_GENERATOR = r"""
import base64, errno, json, sys, tempfile
import seccomp
spec = json.loads(sys.argv[1])
native = seccomp.Arch.NATIVE
f = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
numbers, unknown = {}, []
def deny(name, *args, err=errno.EPERM):
    try:
        number = seccomp.resolve_syscall(native, name)
        f.add_rule(seccomp.ERRNO(err), name, *args)
    except (RuntimeError, ValueError):
        unknown.append(name)
        return
    if number >= 0:
        numbers[name] = number
for name in spec["denied"]:
    deny(name)
deny("clone3", err=errno.ENOSYS)
for bit in spec["clone_flags"]:
    deny("clone", seccomp.Arg(0, seccomp.MASKED_EQ, bit, bit))
for call in ("socket", "socketpair"):
    for family in range(spec["af_max"]):
        if family not in spec["families"]:
            deny(call, seccomp.Arg(0, seccomp.MASKED_EQ, 0xFFFFFFFF, family))
    deny(call, seccomp.Arg(0, seccomp.GE, spec["af_max"]))
deny("prctl", seccomp.Arg(0, seccomp.MASKED_EQ, 0xFFFFFFFF, spec["pdeathsig"]))
for request in spec["ioctls"]:
    deny("ioctl", seccomp.Arg(1, seccomp.MASKED_EQ, 0xFFFFFFFF, request))
with tempfile.TemporaryFile() as out:
    f.export_bpf(out)
    out.seek(0)
    program = out.read()
print(json.dumps({"bpf": base64.b64encode(program).decode(), "numbers": numbers, "unknown": sorted(set(unknown))}))
"""


@dataclass(frozen=True, slots=True)
class SeccompProgram:
    """The filter as bubblewrap reads it (``bpf``: a raw ``struct sock_filter`` array), the native
    number of each denied call (``numbers``, for checks from inside) and the names this libseccomp
    does not know (``unknown``: not filtered, documented)."""

    bpf: bytes
    numbers: dict[str, int] = field(default_factory=dict)
    unknown: tuple[str, ...] = ()
    builder: str = ""


def denied_names() -> tuple[str, ...]:
    return tuple(name for group in DENIED.values() for name in group)


def _spec() -> str:
    return json.dumps({"denied": denied_names(), "clone_flags": CLONE_NAMESPACE_FLAGS, "af_max": AF_MAX,
                       "families": sorted(SOCKET_FAMILIES.values()), "pdeathsig": PR_SET_PDEATHSIG,
                       "ioctls": TERMINAL_IOCTLS})


def _builders() -> list[str]:
    """Interpreters to try for libseccomp's bindings: this one, then the system's."""
    found = [sys.executable]
    system = shutil.which("python3", path="/usr/bin:/bin")
    if system and system not in found:
        found.append(system)
    return found


@functools.lru_cache(maxsize=1)
def seccomp_program() -> SeccompProgram | str:
    """The sandbox's seccomp program, or why none could be built (then the sandbox refuses to run)."""
    reasons = []
    for python in _builders():
        try:
            out = subprocess.run([python, "-I", "-c", _GENERATOR, _spec()], capture_output=True, text=True,
                                 timeout=60, env={}, check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            reasons.append(f"{python}: {exc}")
            continue
        if out.returncode != 0:
            last = (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[-1]
            reasons.append(f"{python}: {last[:200]}")
            continue
        made = json.loads(out.stdout)
        missing = [name for name in REQUIRED if name in made["unknown"]]
        if missing:
            return f"libseccomp (via {python}) does not know {', '.join(missing)}; update libseccomp"
        return SeccompProgram(base64.b64decode(made["bpf"]), dict(made["numbers"]), tuple(made["unknown"]), python)
    return ("the Python sandbox's seccomp filter is built with libseccomp's Python bindings, which no interpreter "
            "here has (Debian: apt-get install python3-seccomp); " + "; ".join(reasons))
