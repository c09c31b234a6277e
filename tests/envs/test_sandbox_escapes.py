"""Escape attempts against the Python sandbox: none may reach the host, and each comes back as a
failed tool call (an ``error:`` line), never a crash of the caller.

Every probe runs real model-style code in the real sandbox (bubblewrap); the host side checks that
nothing happened: no file written or read, no process signalled or traced, no socket reached, no
secret leaked, nothing left running.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time

import pytest

from rlvr.envs.multiturn.tools import PythonSandbox, ToolEnv, bwrap_available

pytestmark = pytest.mark.skipif(not bwrap_available(), reason="bubblewrap does not work on this machine")
SECRET = "rlvr-escape-secret-4f1c"


@pytest.fixture(scope="module")
def sandbox():
    return PythonSandbox(timeout_s=8, cpu_s=4, memory_mb=256)


@pytest.fixture
def host(tmp_path, monkeypatch):
    """A host with things worth attacking: a secret file, a directory, an env var, a process."""
    monkeypatch.setenv("RLVR_ESCAPE_SECRET", SECRET)
    (tmp_path / "secret.txt").write_text(SECRET)
    victim = subprocess.Popen(["sleep", "60"])
    yield {"dir": tmp_path, "outside": tmp_path / "escaped", "secret": tmp_path / "secret.txt", "pid": victim.pid}
    victim.kill()
    victim.wait()


def probe(sandbox, code: str):
    result = sandbox.run(code)
    assert "ESCAPED" not in result.output, result
    return result


# Each probe either raises inside the sandbox (an error line) or prints ESCAPED if it got through.
WRITES = [
    "import posix\nr = posix.system('touch {outside}')\nif r == 0: print('ESCAPED')\nraise OSError(f'system: {{r}}')",
    "import importlib, os\nimportlib.reload(os)\nr = os.system('touch {outside}')\nif r == 0: print('ESCAPED')\n"
    "raise OSError(f'system: {{r}}')",
    "import sys\nsys.modules.pop('_posixsubprocess', None)\nimport subprocess\nsubprocess.run(['touch', '{outside}'])\n"
    "print('ESCAPED')",
    "import ctypes\nr = ctypes.CDLL(None).system(b'touch {outside}')\nif r == 0: print('ESCAPED')\n"
    "raise OSError(f'system: {{r}}')",
    "import _io\n_io.FileIO('{outside}', 'w').write(b'x')\nprint('ESCAPED')",
    "import os\nos.chdir('{dir}')\nopen('escaped', 'w').write('x')\nprint('ESCAPED')",
    "import os\nfd = os.open('{dir}', os.O_RDONLY)\nos.unlink('secret.txt', dir_fd=fd)\nprint('ESCAPED')",
    "import os\nos.symlink('{outside}', 'link')\nopen('link', 'w').write('x')\nprint('ESCAPED')",
    "import os\nos.link('{secret}', 'hard')\nprint('ESCAPED')",
    "open('/usr/escaped', 'w').write('x')\nprint('ESCAPED')",
]


@pytest.mark.parametrize("code", WRITES)
def test_nothing_outside_the_sandbox_can_be_written_or_removed(sandbox, host, code):
    result = probe(sandbox, code.format(**host))
    assert not result.ok and result.error.startswith("error:")
    assert not host["outside"].exists() and host["secret"].read_text() == SECRET
    assert not os.path.exists("/usr/escaped")


READS = [
    "print(open('{secret}').read())",
    "import os\nos.symlink('{secret}', 'link')\nprint(open('link').read())",
    "import os\nprint([open(f'/proc/{{p}}/environ', 'rb').read() for p in os.listdir('/proc') if p.isdigit()])",
    "import os\nprint(os.environ)",
    "print(open('/etc/passwd').read())",
    "import os\nprint(os.listdir('{dir}'))",
]


@pytest.mark.parametrize("code", READS)
def test_no_host_file_or_secret_can_be_read(sandbox, host, code):
    result = probe(sandbox, code.format(**host))
    assert SECRET not in result.output and SECRET not in (result.error or "")
    assert "root:" not in result.output


PROCESSES = [
    "import posix\nposix.kill({pid}, 9)\nprint('ESCAPED')",
    "import os\nos.kill(-1, 9)\nprint('ESCAPED')",
    "import ctypes\nr = ctypes.CDLL(None).ptrace(16, {pid}, 0, 0)\nif r == 0: print('ESCAPED')\n"
    "raise OSError(f'ptrace: {{r}}')",
    "import os\nwhile True:\n    os.fork()",  # a fork bomb
    "import os\nif os.fork() == 0:\n    os.setsid()\n    import time\n    time.sleep(60)\nprint('ESCAPED')",
    "import threading\nthreading.Thread(target=lambda: None).start()\nprint('ESCAPED')",
]


@pytest.mark.parametrize("code", PROCESSES)
def test_no_process_can_be_signalled_traced_or_started(sandbox, host, code):
    result = probe(sandbox, code.format(**host))
    assert not result.ok and result.error.startswith("error:")
    assert subprocess.run(["kill", "-0", str(host["pid"])], check=False).returncode == 0  # the victim lives


def test_the_probes_do_escape_a_child_without_isolation(host):
    # The guard for every test above: the same code, unisolated, really does reach the host.
    unsafe = PythonSandbox(timeout_s=5, isolation="unsafe_subprocess")
    assert SECRET in unsafe(READS[0].format(**host))
    unsafe(PROCESSES[0].format(**host))
    time.sleep(0.2)
    state = subprocess.run(["ps", "-o", "stat=", "-p", str(host["pid"])], capture_output=True, text=True,
                           check=False).stdout.strip()
    assert state == "" or state.startswith("Z"), state  # killed: gone, or a zombie ("ZN" under nice)


def test_only_its_own_processes_are_visible(sandbox):
    pids = sandbox("import os\nsorted(int(p) for p in os.listdir('/proc') if p.isdigit())")
    assert eval(pids) == [1]  # noqa: S307 - the interpreter alone: no bubblewrap init, nothing of the host


def test_nothing_is_left_running_after_a_timeout():
    from rlvr.envs.services.sandbox_host import owner_token

    mine = f"rlvr-sandbox-{owner_token()}-"  # in the argv of this process's runs: launcher, bwrap, interpreter
    assert _processes_with(mine) == []
    result = PythonSandbox(timeout_s=1).run("import time\nprint('up', flush=True)\ntime.sleep(30)")
    assert result.timed_out and result.error.startswith("error: [sandbox] TimeoutError") and result.output == "up\n"
    time.sleep(0.2)
    assert _processes_with(mine) == []


def _processes_with(text: str) -> list[int]:
    """Live host pids whose command line holds ``text`` (other sandboxes on the host do not count)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if text.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def test_no_tcp_or_unix_socket_of_the_host_is_reachable(sandbox, tmp_path):
    got: list[str] = []
    tcp = socket.create_server(("127.0.0.1", 0))
    path_sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path_sock.bind(str(tmp_path / "host.sock"))
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract.bind("\0rlvr-escape-test")
    servers = [tcp, path_sock, abstract]
    for s in servers:
        s.listen()
        s.settimeout(0.1)

    def accept_all():
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            for s in servers:
                try:
                    s.accept()
                    got.append(str(s))
                except OSError:
                    pass

    watcher = threading.Thread(target=accept_all)
    watcher.start()
    port = tcp.getsockname()[1]
    attempts = [
        f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('ESCAPED')",
        "import socket\ns = socket.socket(socket.AF_UNIX)\n"
        f"s.connect({str(tmp_path / 'host.sock')!r})\nprint('ESCAPED')",
        "import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect('\\0rlvr-escape-test')\nprint('ESCAPED')",
        "import socket\nsocket.getaddrinfo('example.com', 80)\nprint('ESCAPED')",
    ]
    try:
        for code in attempts:
            result = probe(sandbox, code)
            assert not result.ok and result.error.startswith("error:"), result
    finally:
        watcher.join()
        for s in servers:
            s.close()
    assert got == []


def test_an_escape_attempt_is_a_failed_tool_call_not_a_crash(host):
    env = ToolEnv(tools=("python",), answer_format="plain", sandbox={"timeout_s": 5})
    call = f"<tool>python: import posix; posix.kill({host['pid']}, 9)</tool>"
    reply = env.interact([{"role": "user", "content": "go"}, {"role": "assistant", "content": call}],
                         {"answer": "1", "info": {}, "turn": 1})
    assert len(reply) == 1 and reply[0]["role"] == "tool" and reply[0]["content"].startswith("error:")
