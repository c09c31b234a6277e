"""The Python sandbox's seccomp filter: the system calls sandboxed code may not make, as the BPF
program that bubblewrap loads (``bwrap --seccomp FD``) right before it runs the interpreter.

The program is built by libseccomp, through its own Python bindings (module ``seccomp``; Debian:
``python3-seccomp``), in a child interpreter that has them: this one if it can import ``seccomp``,
else the system's ``python3``. It is built once per process and kept as bytes.

What the program keeps invariant (see :data:`DENIED` for the reason of each group):

- every call named in :data:`DENIED` fails with ``EPERM``, whatever its arguments;
- ``socket``/``socketpair`` of any family but ``AF_UNIX`` fail with ``EAFNOSUPPORT`` (no TCP, UDP, raw,
  netlink or packet socket can be made: their kernel buffers are memory no limit of the run counts),
  and of ``AF_UNIX`` with any type but ``SOCK_STREAM`` with ``ESOCKTNOSUPPORT`` (a datagram socket
  queues other senders' datagrams); with ``listen`` denied and socket buffer sizes fixed, what a
  run's sockets hold is bounded by its open files (``docs/sandbox.md`` states the margin);
- ``setsockopt`` of the buffer sizes, ``fcntl(F_SETPIPE_SZ)``, ``clone`` with any namespace flag,
  ``prctl(PR_SET_PDEATHSIG)``, a new ``RLIMIT_CPU`` (through ``setrlimit`` or ``prlimit64``) and the
  terminal-injecting ``ioctl``\\ s fail with ``EPERM``; ``clone3`` fails with ``ENOSYS`` (its flags sit
  in memory a filter cannot read; libc then falls back to ``clone``, whose flags it can);
- ``exit``/``exit_group`` with a status of 128 or more kill the process (``SIGSYS``): bubblewrap
  reports a death by signal N as exit status ``128 + N``, so every status of 128 or more that the
  host sees is a signal the kernel delivered, never one the code chose; with its CPU limit fixed
  and no other process beside it, a ``SIGKILL`` the code did not get from the host is the kernel's
  at that limit;
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
    # Memory that the address-space limit does not count: SysV IPC, memfd, POSIX message queues;
    # listen (a listening socket queues up to somaxconn unaccepted connections, each holding what its
    # sender wrote); vmsplice (a pipe would hold a reference to each huge page it took a piece of,
    # 2 MiB for 4 KiB); inotify (each watch pins a host inode in memory, up to a per-user count).
    "memory outside the limits": ("memfd_create", "memfd_secret", "shmget", "shmat", "shmctl", "msgget", "msgsnd",
                                  "msgrcv", "msgctl", "semget", "semctl", "semop", "semtimedop", "mq_open",
                                  "listen", "vmsplice", "inotify_init", "inotify_init1", "inotify_add_watch"),
    # Host-wide state; these need capabilities the sandbox lacks, and are denied all the same.
    "host state": ("kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot",
                   "swapon", "swapoff", "acct", "quotactl", "quotactl_fd", "syslog", "settimeofday",
                   "clock_settime", "clock_adjtime", "adjtimex", "sethostname", "setdomainname", "iopl", "ioperm",
                   "migrate_pages", "move_pages"),
}
# Must be known to libseccomp, else the sandbox refuses to run (the rest is denied where known).
REQUIRED = ("ptrace", "process_vm_readv", "process_vm_writev", "keyctl", "add_key", "request_key", "unshare",
            "setns", "mount", "umount2", "pivot_root", "io_uring_setup", "io_uring_enter", "io_uring_register",
            "userfaultfd", "perf_event_open", "bpf", "memfd_create", "shmget", "clone", "clone3", "socket", "prctl",
            "socketpair", "listen", "vmsplice", "setsockopt", "fcntl", "prlimit64", "exit", "exit_group")
AF_UNIX, SOCK_STREAM = 1, 1  # the only socket family, and its only type, that the code may make
SOCK_TYPE_MASK = 0xF  # the kernel's: the type argument's other bits are SOCK_NONBLOCK and SOCK_CLOEXEC
SOL_SOCKET = 1
BUFFER_OPTIONS = (7, 8, 32, 33)  # SO_SNDBUF, SO_RCVBUF, SO_SNDBUFFORCE, SO_RCVBUFFORCE: kept at the defaults
F_SETPIPE_SZ = 1031  # a pipe keeps the default 16 pages (up to 1 MiB each otherwise)
RLIMIT_CPU = 0  # fixed by the host: a lower one the code set would be a CPU-limit kill of its own choosing
SIGNAL_STATUS_BIT = 0x80  # an exit status of 128 or more reads as a signal once bubblewrap passes it on
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
word = 0xFFFFFFFF  # int arguments: the kernel reads the low 32 bits of the register
for call in ("socket", "socketpair"):
    deny(call, seccomp.Arg(0, seccomp.NE, spec["af_unix"]), err=errno.EAFNOSUPPORT)
    for kind in range(spec["type_mask"] + 1):
        if kind != spec["sock_stream"]:
            deny(call, seccomp.Arg(0, seccomp.EQ, spec["af_unix"]),
                 seccomp.Arg(1, seccomp.MASKED_EQ, spec["type_mask"], kind), err=errno.ESOCKTNOSUPPORT)
for option in spec["buffer_options"]:
    deny("setsockopt", seccomp.Arg(1, seccomp.MASKED_EQ, word, spec["sol_socket"]),
         seccomp.Arg(2, seccomp.MASKED_EQ, word, option))
deny("fcntl", seccomp.Arg(1, seccomp.MASKED_EQ, word, spec["setpipe_sz"]))
deny("setrlimit", seccomp.Arg(0, seccomp.MASKED_EQ, word, spec["rlimit_cpu"]))
deny("prlimit64", seccomp.Arg(1, seccomp.MASKED_EQ, word, spec["rlimit_cpu"]), seccomp.Arg(2, seccomp.NE, 0))
bit = spec["signal_bit"]
for call in ("exit", "exit_group"):
    f.add_rule(seccomp.KILL_PROCESS, call, seccomp.Arg(0, seccomp.MASKED_EQ, bit, bit))
deny("prctl", seccomp.Arg(0, seccomp.MASKED_EQ, word, spec["pdeathsig"]))
for request in spec["ioctls"]:
    deny("ioctl", seccomp.Arg(1, seccomp.MASKED_EQ, word, request))
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
    return json.dumps({"denied": denied_names(), "clone_flags": CLONE_NAMESPACE_FLAGS, "af_unix": AF_UNIX,
                       "sock_stream": SOCK_STREAM, "type_mask": SOCK_TYPE_MASK, "sol_socket": SOL_SOCKET,
                       "buffer_options": BUFFER_OPTIONS, "setpipe_sz": F_SETPIPE_SZ, "rlimit_cpu": RLIMIT_CPU,
                       "signal_bit": SIGNAL_STATUS_BIT, "pdeathsig": PR_SET_PDEATHSIG, "ioctls": TERMINAL_IOCTLS})


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
