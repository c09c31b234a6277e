"""The Python sandbox's limits, checked from the host: a seccomp filter, no init to borrow, memory,
inodes, processes and keyrings bounded, nothing left behind (``test_sandbox_verdicts.py`` has the
forged verdicts, ``test_sandbox_sockets.py`` the sockets and the kernel memory they could hold).

Each escape here is real model-style code against the real sandbox; what counts is what the host
sees (its memory, its slab of tmpfs inodes, its processes, its folders, its keyrings), not what the
code says. Sandboxed code names its own process ``rlvr<hex>`` (``/proc/PID/comm``) so that the host
can look for it after the run.
"""

from __future__ import annotations

import os
import platform
import secrets
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import rlvr
from rlvr.envs.multiturn.tools import PythonSandbox, bwrap_available

pytestmark = pytest.mark.skipif(not bwrap_available(), reason="bubblewrap does not work on this machine")
X86_64 = platform.machine() == "x86_64"
SRC = str(Path(rlvr.__file__).resolve().parents[1])  # helper processes import the rlvr under test
NAME_SELF = "import ctypes\nctypes.CDLL(None).prctl(15, {token!r}.encode(), 0, 0, 0)\n"


@pytest.fixture(scope="module")
def sandbox():
    return PythonSandbox(timeout_s=8, cpu_s=4, memory_mb=256)


def token() -> str:
    return f"rlvr{secrets.token_hex(5)}"


def running(name: str) -> list[int]:
    """Host pids whose process name is ``name`` and that still run (zombies are dead: their
    reaping is their parent's, or the host init's, business)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            alive = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
            if alive and Path(f"/proc/{pid}/comm").read_text().strip() == name:
                found.append(int(pid))
        except (OSError, IndexError):
            pass
    return found


def leftovers(pid: int) -> list[str]:
    """Run folders of the process ``pid`` still on the host."""
    from rlvr.envs.services.sandbox_host import run_bases

    return [os.path.join(base, n) for base in run_bases() for n in os.listdir(base)
            if n.startswith(f"rlvr-sandbox-{pid}.")]


def meminfo(field: str) -> int:
    line = next(x for x in Path("/proc/meminfo").read_text().splitlines() if x.startswith(field + ":"))
    return int(line.split()[1]) * 1024


def tmpfs_inodes() -> int:
    """Live tmpfs inodes on the whole host (``shmem_inode_cache`` in ``/proc/slabinfo``)."""
    line = next(x for x in Path("/proc/slabinfo").read_text().splitlines() if x.startswith("shmem_inode_cache "))
    return int(line.split()[1])


def peak_during(measure, run):
    """``run()``'s result and the highest ``measure()`` seen while it ran, less the value before."""
    before, peak, done = measure(), [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], measure() - before)
            time.sleep(0.02)

    watcher = threading.Thread(target=sample)
    watcher.start()
    try:
        result = run()
    finally:
        done.set()
        watcher.join()
    return result, peak[0]


# ------------------------------------------------------------------------------------ seccomp


@pytest.fixture(scope="module")
def denied_errnos(sandbox):
    """Every denied system call made once from inside (all arguments 0): name -> errno."""
    from rlvr.envs.services.sandbox_seccomp import seccomp_program

    numbers = seccomp_program().numbers
    calls = {name: nr for name, nr in numbers.items() if name in _denied()}  # denied whatever the arguments
    code = textwrap.dedent(f"""
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        out = {{}}
        for name, nr in {calls!r}.items():
            ctypes.set_errno(0)
            r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(0)] * 6)
            out[name] = ctypes.get_errno() if r == -1 else 0
        out
    """)
    return eval(sandbox(code))  # noqa: S307 - a dict literal the sandbox printed


def _denied() -> list[str]:
    try:
        from rlvr.envs.services.sandbox_seccomp import denied_names
    except ImportError:  # a sandbox without a filter: the calls it must deny at least
        return ["ptrace", "process_vm_readv", "process_vm_writev", "keyctl", "add_key", "request_key", "unshare",
                "setns", "mount", "umount2", "pivot_root", "io_uring_setup", "userfaultfd", "perf_event_open", "bpf"]
    return [*denied_names(), "clone3"]


@pytest.mark.parametrize("name", _denied() if bwrap_available() else [])
def test_each_denied_system_call_fails_inside_the_sandbox(denied_errnos, name):
    if name not in denied_errnos:
        pytest.skip(f"{name} does not exist on {platform.machine()}")
    expected = 38 if name == "clone3" else 1  # ENOSYS (libc falls back to clone) else EPERM
    assert denied_errnos[name] == expected, (name, denied_errnos[name])


def test_the_filter_denies_foreign_sockets_and_keeping_a_child_alive(sandbox):
    from rlvr.envs.services.sandbox_seccomp import seccomp_program

    code = textwrap.dedent(f"""
        import ctypes, socket
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        out = {{}}
        for family in (2, 10, 16, 40, 17, 38, 45, 46, 200, 2**32 + 1):  # inet, inet6, netlink, vsock, packet...
            ctypes.set_errno(0)
            r = libc.syscall(ctypes.c_long({seccomp_program().numbers["socket"]}), ctypes.c_long(family), 1, 0)
            out[family] = 0 if r >= 0 else ctypes.get_errno()
        ctypes.set_errno(0)
        out["pdeathsig"] = libc.prctl(1, 0, 0, 0, 0), ctypes.get_errno()
        out["unix"] = socket.socket(socket.AF_UNIX).family == socket.AF_UNIX
        out["status"] = [x for x in open("/proc/self/status").read().splitlines() if x.startswith("Seccomp:")]
        out
    """)
    out = eval(sandbox(code))  # noqa: S307 - a dict literal the sandbox printed
    assert all(out[family] == 97 for family in (2, 10, 16, 40, 17, 38, 45, 46, 200, 2**32 + 1)), out  # EAFNOSUPPORT
    assert out["pdeathsig"] == (-1, 1) and out["unix"]
    assert out["status"] == ["Seccomp:\t2"]  # filter mode


@pytest.mark.skipif(not X86_64, reason="the x32 system call numbering is x86-64's")
def test_a_system_call_of_another_abi_kills_the_process(sandbox):
    result = sandbox.run("import ctypes\nprint(ctypes.CDLL(None).syscall(0x40000000 | 39))")  # x32 getpid
    assert result.output == "" and result.signal == "SIGSYS" and result.exit_code is None, result
    assert result.error.startswith("error: [sandbox] killed by signal SIGSYS"), result


# -------------------------------------------------------------------------------- processes


INJECT = r"""
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
names = ("r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi rdi orig_rax rip cs eflags rsp ss "
         "fs_base gs_base ds es fs gs").split()
Regs = type("Regs", (ctypes.Structure,), {"_fields_": [(n, ctypes.c_ulonglong) for n in names]})
def call(request, pid, addr=None, data=None):
    if libc.ptrace(request, pid, addr, data) == -1:
        raise OSError(ctypes.get_errno(), f"ptrace({request}, {pid})")
import os, time
others = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]
target = others[0] if others else 1  # bubblewrap's init, where there is one
call(16, target)  # PTRACE_ATTACH
os.waitpid(target, 0x40000000)
saved, regs = Regs(), Regs()
call(12, target, None, ctypes.byref(saved))
with open(f"/proc/{target}/mem", "rb") as mem:
    for line in open(f"/proc/{target}/maps"):
        span, perms = line.split()[:2]
        if "x" in perms:
            lo, hi = (int(x, 16) for x in span.split("-"))
            mem.seek(lo)
            at = mem.read(hi - lo).find(b"\x0f\x05")  # a syscall instruction
            if at >= 0:
                break
ctypes.pointer(regs)[0] = saved
regs.rip, regs.rax, regs.orig_rax, regs.rdi, regs.rsi = lo + at, 157, 2**64 - 1, 1, 0  # prctl(PDEATHSIG, 0)
call(13, target, None, ctypes.byref(regs))
call(9, target)
os.waitpid(target, 0x40000000)
call(13, target, None, ctypes.byref(saved))
call(17, target)
print("ESCAPED: the init runs on without its parent-death signal", flush=True)
time.sleep(20)
"""


@pytest.mark.skipif(not X86_64, reason="the injection is x86-64 machine code")
def test_the_init_cannot_be_traced_to_outlive_the_timeout(sandbox):
    # The sandboxed code traces the sandbox's init, makes it clear its parent-death signal, then
    # sleeps: if that works, it is still running after run() reported the timeout.
    name = token()
    quick = PythonSandbox(timeout_s=3, cpu_s=3, memory_mb=256)
    result = quick.run(NAME_SELF.format(token=name) + INJECT)
    time.sleep(0.5)
    survivors = running(name)
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    assert "ESCAPED" not in result.output and survivors == [], (result, survivors)
    assert not result.ok and "ptrace" in result.error and not result.timed_out


def test_no_other_process_of_the_sandbox_can_be_traced_or_read(sandbox):
    code = textwrap.dedent("""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        got = []
        for pid in (int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()):
            if libc.ptrace(16, pid, 0, 0) == 0:
                got.append(("ptrace", pid))
            try:
                os.open(f"/proc/{pid}/mem", os.O_RDWR)
                got.append(("mem", pid))
            except OSError:
                pass
        ctypes.set_errno(0)
        print(got, libc.ptrace(0, 0, 0, 0), ctypes.get_errno())
    """)
    assert sandbox(code) == "[] -1 1"  # nothing else to reach, and ptrace itself denied (EPERM)


def test_a_timed_out_run_leaves_no_process_no_folder_and_no_cgroup():
    from rlvr.envs.services.sandbox_host import cgroup_parent, owner_token

    name = token()
    code = NAME_SELF.format(token=name) + "import time\nprint('up', flush=True)\ntime.sleep(60)"
    result = PythonSandbox(timeout_s=1.5).run(code)
    assert result.timed_out and result.output == "up\n"
    assert running(name) == [] and leftovers(os.getpid()) == []
    parent = cgroup_parent()
    if not isinstance(parent, str):
        assert not [n for n in os.listdir(parent.path) if n.startswith(f"rlvr-sandbox-{owner_token()}-")]


# ----------------------------------------------------------------------------- memory and disk


PIN = {
    "sysv_shm": """
        libc = ctypes.CDLL(None, use_errno=True)
        libc.shmat.restype = ctypes.c_void_p
        for _ in range(16):
            sid = libc.shmget(0, 64 << 20, 0o1600)
            if sid < 0:
                raise OSError(ctypes.get_errno(), "shmget")
            at = libc.shmat(sid, None, 0)
            ctypes.memset(at, 1, 64 << 20)
            libc.shmdt(ctypes.c_void_p(at))
            pinned += 64
    """,
    "memfd": """
        import os
        for i in range(60):
            fd = os.memfd_create(f"m{i}")
            for _ in range(16):
                os.write(fd, b"x" * (1 << 20))
            pinned += 16
    """,
    "nested_namespace_tmpfs": """
        import os
        libc = ctypes.CDLL(None, use_errno=True)
        uid, gid = os.getuid(), os.getgid()
        if libc.unshare(0x10000000 | 0x00020000) != 0:
            raise OSError(ctypes.get_errno(), "unshare")
        open("/proc/self/setgroups", "w").write("deny")
        open("/proc/self/uid_map", "w").write(f"0 {uid} 1")
        open("/proc/self/gid_map", "w").write(f"0 {gid} 1")
        if libc.mount(b"none", b"/tmp", b"tmpfs", 0, None) != 0:
            raise OSError(ctypes.get_errno(), "mount")
        for i in range(64):
            with open(f"/tmp/f{i}", "wb") as f:
                for _ in range(16):
                    f.write(b"x" * (1 << 20))
            pinned += 16
    """,
    "writable_folders": """
        for folder in ("/", "/dev", "/dev/shm", "/work", "/tmp"):
            for i in range(64):
                if pinned >= 1024:
                    break
                try:
                    with open(f"{folder}/f{i}", "wb") as f:
                        for _ in range(16):
                            f.write(b"x" * (1 << 20))
                        pinned += 16
                except OSError:
                    break
    """,
}


@pytest.mark.parametrize("channel", sorted(PIN))
def test_memory_outside_the_address_space_stays_bounded(channel):
    # 1 GiB tried through each channel with memory_mb=256; the host's shared memory (tmpfs, SysV,
    # memfd) must not grow by more than the scratch tmpfs and some noise from other processes.
    body = textwrap.indent(textwrap.dedent(PIN[channel]), "    ")
    code = f"import ctypes, time\npinned = 0\ntry:\n{body}\nexcept OSError as exc:\n    print(exc)\n" \
           "print('pinned MB', pinned, flush=True)\ntime.sleep(1.0)"
    small = PythonSandbox(timeout_s=6, cpu_s=5, memory_mb=256)
    result, grew = peak_during(lambda: meminfo("Shmem"), lambda: small.run(code))
    assert grew < 256 * 2**20, (channel, grew >> 20, result)


@pytest.mark.skipif(not os.access("/proc/slabinfo", os.R_OK), reason="/proc/slabinfo is readable by root only")
def test_an_inode_flood_stays_bounded():
    code = textwrap.dedent("""
        import os, time
        made, deadline = 0, time.monotonic() + 2.0
        for folder in ("/", "/dev", "/dev/shm", "/work", "/tmp"):
            try:
                while made < 300_000 and time.monotonic() < deadline:
                    os.close(os.open(f"{folder}/e{made}", os.O_CREAT | os.O_WRONLY))
                    made += 1
            except OSError:
                pass
        print("files", made, flush=True)
        time.sleep(1.0)
    """)
    small = PythonSandbox(timeout_s=6, cpu_s=5, memory_mb=256)
    result, grew = peak_during(tmpfs_inodes, lambda: small.run(code))
    assert grew < 20_000, (grew, result)


# -------------------------------------------------------------------------------------- keyrings


@pytest.mark.skipif(not X86_64 or shutil.which("keyctl") is None, reason="x86-64 system call numbers; keyctl")
def test_keyrings_of_the_trainer_and_of_earlier_runs_are_out_of_reach(tmp_path):
    secret = f"rlvr-key-{secrets.token_hex(6)}"
    reach = textwrap.dedent("""
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        found = []
        for ring in (-3, -4, -5):  # session, user, user-session keyrings
            ids = (ctypes.c_int32 * 64)()
            n = libc.syscall(250, 11, ring, ids, 256)  # KEYCTL_READ
            for key in ids[:max(0, min(n, 256)) // 4]:
                buf = ctypes.create_string_buffer(512)
                if libc.syscall(250, 11, key, buf, 512) > 0:  # KEYCTL_READ of the key
                    found.append(buf.value.decode(errors="replace"))
                desc = ctypes.create_string_buffer(512)
                if libc.syscall(250, 6, key, desc, 512) > 0:  # KEYCTL_DESCRIBE
                    found.append(desc.value.decode(errors="replace"))
            libc.syscall(248, b"user", b"rlvr-left-behind", b"from-the-sandbox", 16, ring)  # add_key
        print(found)
    """)
    script = textwrap.dedent(f"""
        import subprocess, sys
        sys.path.insert(0, {SRC!r})
        from rlvr.envs.multiturn.tools import PythonSandbox
        subprocess.run(["keyctl", "add", "user", "rlvr-host-key", {secret!r}, "@s"], check=True,
                       stdout=subprocess.DEVNULL)
        box = PythonSandbox(timeout_s=8)
        print("RUN1", box({reach!r}))
        print("RUN2", box({reach!r}))
        print("HOST", subprocess.run(["keyctl", "show", "@s"], capture_output=True, text=True).stdout)
    """)
    out = subprocess.run(["keyctl", "session", "-", sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path).stdout
    runs = [line for line in out.splitlines() if line.startswith("RUN")]
    assert len(runs) == 2, out
    assert secret not in "\n".join(runs) and "rlvr-left-behind" not in out, out
    assert "rlvr-host-key" in out.split("HOST", 1)[1]  # the host's own key is still there


# ------------------------------------------------------------------------------------------ crashes


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="a PID namespace needs root")
def test_no_zombie_is_left_when_the_trainer_is_pid_1(tmp_path):
    script = textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {SRC!r})
        from rlvr.envs.multiturn.tools import PythonSandbox
        box = PythonSandbox(timeout_s=1)
        box("1 + 1"), box("1 / 0"), box("import time; time.sleep(30)")
        time.sleep(0.3)
        zombies = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            stat = open(f"/proc/{{pid}}/stat").read().rsplit(")", 1)[1].split()
            if stat[0] == "Z" and stat[1] == "1":
                zombies.append(pid)
        print("PID", os.getpid(), "ZOMBIES", len(zombies))
    """)
    out = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", script],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert "PID 1 ZOMBIES 0" in out.stdout, (out.stdout, out.stderr[-2000:])


def test_a_killed_trainer_leaves_no_process_and_its_folder_goes_at_the_next_start(tmp_path):
    from rlvr.envs.services.sandbox_host import remove_stale

    name = token()
    code = NAME_SELF.format(token=name) + "import time\ntime.sleep(60)"
    script = f"import sys\nsys.path.insert(0, {SRC!r})\nfrom rlvr.envs.multiturn.tools import PythonSandbox\n" \
             f"PythonSandbox(timeout_s=30).run({code!r})"
    trainer = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "TMPDIR": str(tmp_path)})
    deadline = time.monotonic() + 60
    while not running(name) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert running(name), "the sandboxed code never started"
    trainer.kill()
    trainer.wait()
    time.sleep(0.5)
    assert running(name) == []  # the run died with the trainer
    left = leftovers(trainer.pid)
    assert left, "a killed trainer's run folder was expected to stay until the next start"
    assert set(left) <= set(remove_stale())
    assert leftovers(trainer.pid) == []


# -------------------------------------------------------------------------------- missing pieces


def test_a_missing_piece_is_named_and_the_sandbox_refuses(monkeypatch):
    from rlvr.envs.services import sandbox_launch, sandbox_seccomp

    real = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, path=None: None if name == "keyctl" else real(name, path=path))
    assert "keyutils" in sandbox_launch.find_tools(root=False)
    monkeypatch.setattr(sandbox_seccomp, "_builders", lambda: ["/nonexistent/python3"])
    reason = sandbox_seccomp.seccomp_program.__wrapped__()
    assert isinstance(reason, str) and "python3-seccomp" in reason


def test_a_run_is_held_in_its_own_cgroup_and_the_cgroup_goes_with_it():
    from rlvr.envs.services.sandbox_host import cgroup_parent, owner_token

    parent = cgroup_parent()
    if isinstance(parent, str):
        pytest.skip(parent)
    mine = f"rlvr-sandbox-{owner_token()}-"
    box, result = PythonSandbox(timeout_s=5), []
    worker = threading.Thread(target=lambda: result.append(box.run("import time\ntime.sleep(1.5)")))
    worker.start()
    comms: set[str] = set()
    deadline = time.monotonic() + 4
    while not any(c.startswith("python") for c in comms) and time.monotonic() < deadline:
        for name in (n for n in os.listdir(parent.path) if n.startswith(mine)):
            try:
                pids = Path(parent.path, name, "cgroup.procs").read_text().split()
                comms |= {Path(f"/proc/{pid}/comm").read_text().strip() for pid in pids}
            except OSError:
                pass  # gone between the listing and the read
        time.sleep(0.05)
    worker.join()
    assert result[0].ok and "bwrap" in comms and any(c.startswith("python") for c in comms), comms
    assert not [n for n in os.listdir(parent.path) if n.startswith(mine)]
