"""A repository's tests, run in the Python sandbox: the coding task's judge.

:class:`TestRunner` writes a repository (path -> text) into a fresh sandbox run's working folder
(``/work`` under bubblewrap, gone with the run; :mod:`rlvr.envs.services.sandbox`), imports each test
file there and calls its ``test_*`` functions in order, each under its own alarm, and reads back one
report line. A test passes when its function returns; anything it raises (a failed assertion, an
import error of the module under test, the alarm) fails it, and the report keeps the failing
assertion's source line (``add(2, 3) == 5``), which is what an agent is shown.

Invariants: the tests a repository has are counted on the host from the test files' text (every
top-level ``def test_...``), so an edit can only pass or fail them, never remove one; a run that
does not end cleanly with its report line (a timeout, a limit, a crash) fails every test, and the
report line carries a nonce drawn per run, which nothing in the repository is given. Reports are
cached by the repository's content (the same files always give the same report, and a group's
samples often write the same edit); a run the sandbox stopped is never cached.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlvr.envs.services.sandbox import PythonSandbox

_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(/[A-Za-z_][A-Za-z0-9_]*)*\.py")
_TEST_DEF = re.compile(r"^def (test_[A-Za-z0-9_]*)\(", re.MULTILINE)
CACHE_SIZE = 4096

# The sandboxed program. Its inputs arrive as JSON string literals; it prints one line, MARK + JSON.
_PROGRAM = r"""
import importlib, json, os, signal, sys, traceback
FILES = json.loads({files})
TESTS = json.loads({tests})
def _alarm(signum, frame):
    raise TimeoutError("took longer than {test_s}s")
def _detail(exc, path):
    lines = [f.line for f in traceback.extract_tb(exc.__traceback__) if f.filename.endswith("/" + path) and f.line]
    if isinstance(exc, AssertionError) and lines and lines[-1].startswith("assert "):
        return lines[-1][len("assert "):]
    return (type(exc).__name__ + ": " + str(exc))[:200]
for path, text in FILES.items():
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
sys.path.insert(0, os.getcwd())
signal.signal(signal.SIGALRM, _alarm)
report = {{}}
for path in TESTS:
    module = None
    try:
        signal.setitimer(signal.ITIMER_REAL, {test_s})
        module = importlib.import_module(path[:-3].replace("/", "."))
    except BaseException as exc:
        report[path] = {{"error": _detail(exc, path)}}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    if module is None:
        continue
    results = report[path] = {{}}
    for name, fn in list(vars(module).items()):
        if not name.startswith("test_") or not callable(fn):
            continue
        try:
            signal.setitimer(signal.ITIMER_REAL, {test_s})
            fn()
            results[name] = None
        except BaseException as exc:
            results[name] = _detail(exc, path)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
sys.stdout.write("\n" + {mark} + json.dumps(report) + "\n")
"""


@dataclass(frozen=True, slots=True)
class TestReport:
    """One run of a repository's tests: every test (``file::name``) as passed or failed, in order."""

    __test__ = False  # not a pytest class

    passed: tuple[str, ...]
    failed: tuple[tuple[str, str], ...]  # (test, why: the failing assertion, or the error)
    error: str | None = None  # the sandbox's verdict when the run did not end with its report

    @property
    def total(self) -> int:
        return len(self.passed) + len(self.failed)

    @property
    def pass_rate(self) -> float:
        return len(self.passed) / self.total if self.total else 0.0

    @property
    def all_pass(self) -> bool:
        return self.total > 0 and not self.failed

    def first_failure(self) -> tuple[str, str] | None:
        return self.failed[0] if self.failed else None


def check_repository(files: Mapping[str, str], tests: Sequence[str], *, who: str = "coding") -> None:
    """Refuses a repository whose paths are not plain relative ``.py`` paths or whose tests are not among
    its files (``who`` names the row)."""
    if not isinstance(files, Mapping) or not files:
        raise ValueError(f"{who}: info.files must be a non-empty mapping of path -> text")
    for path, text in files.items():
        if not isinstance(path, str) or not _PATH.fullmatch(path) or not isinstance(text, str):
            raise ValueError(f"{who}: info.files has {path!r}; paths must be relative like 'pkg/mod.py', texts strings")
    if not tests or any(t not in files for t in tests):
        raise ValueError(f"{who}: info.tests must name test files among info.files, got {list(tests)!r}")


def expected_tests(files: Mapping[str, str], tests: Sequence[str]) -> list[str]:
    """Every test the repository holds, ``file::name``, read from the test files' text."""
    return [f"{path}::{name}" for path in tests for name in _TEST_DEF.findall(files[path])]


class TestRunner:
    """Runs repositories' tests in a :class:`PythonSandbox` (or the options to build one), with a cache."""

    __test__ = False  # not a pytest class

    def __init__(self, sandbox: PythonSandbox | Mapping[str, Any] | None = None, *, test_s: float = 2.0) -> None:
        options = {"timeout_s": 30.0, "memory_mb": 512, "max_output": 20_000}  # each test has its own alarm
        self.sandbox = sandbox if isinstance(sandbox, PythonSandbox) else PythonSandbox(**{**options,
                                                                                            **dict(sandbox or {})})
        self.test_s = float(test_s)
        self._cache: OrderedDict[str, TestReport] = OrderedDict()
        self._lock = threading.Lock()
        self.runs = 0  # sandbox runs made (cache misses)

    def run(self, files: Mapping[str, str], tests: Sequence[str]) -> TestReport:
        check_repository(files, tests)
        key = hashlib.sha256(json.dumps([sorted(files.items()), list(tests)]).encode()).hexdigest()
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        report = self._run(files, tests)
        if report.error is None:
            with self._lock:
                self._cache[key] = report
                while len(self._cache) > CACHE_SIZE:
                    self._cache.popitem(last=False)
        return report

    def _run(self, files: Mapping[str, str], tests: Sequence[str]) -> TestReport:
        mark = f"rlvr-tests-{secrets.token_hex(8)}:"
        program = _PROGRAM.format(files=repr(json.dumps(dict(files))), tests=repr(json.dumps(list(tests))),
                                  test_s=self.test_s, mark=repr(mark))
        with self._lock:
            self.runs += 1
        result = self.sandbox.run(program)
        expected = expected_tests(files, tests)
        lines = [line for line in result.output.splitlines() if line.startswith(mark)]
        if not result.ok or len(lines) != 1:
            why = result.error or "the test run ended without its report"
            return TestReport((), tuple((t, why) for t in expected), why)
        got = json.loads(lines[0][len(mark):])
        passed, failed = [], []
        for test in expected:
            path, name = test.split("::")
            outcome = got.get(path, {})
            if "error" in outcome and name not in outcome:
                failed.append((test, str(outcome["error"])))
            elif name in outcome and outcome[name] is None:
                passed.append(test)
            else:
                failed.append((test, str(outcome.get(name, "not run"))))
        return TestReport(tuple(passed), tuple(failed))
