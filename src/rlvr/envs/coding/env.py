"""The coding environment: an agent edits a small repository, and the repository's tests decide.

:class:`CodingEnv` scores a reply (the last assistant message, in the edit format of
:mod:`rlvr.envs.coding.edits`) against the row's repository (``info["files"]``, its test files in
``info["tests"]``): the edits are applied to a copy, the copy's tests run in the Python sandbox
(:mod:`rlvr.envs.coding.runner`), and the reward is **all-pass**: ``resolved`` = 1.0 when every test
of the repository passes, else 0.0 (SWE-Gym's "resolved"; partial credit would pay an agent for
leaving the repository as it found it, whose other tests already pass). Recorded beside it at
weight 0: ``pass_rate`` (passed / the repository's tests), ``refused`` (1.0 when the reply was not
applied: not an edit, a test file or a path outside the repository, guarded text; nothing runs and
it scores 0) and ``timed_out``.

Rows come from :func:`rlvr.envs.coding.repos.make_rows` (``task.params``: ``functions``, ``kinds``,
``max_value``), or from any data whose rows carry ``info.files`` and ``info.tests``. An agent
program (``task.agent``) finds the failing test itself with :func:`agent_view` and returns its
reply; the same reward scores it. Without bubblewrap the environment refuses at construction
(``isolation = "unsafe_subprocess"`` runs trusted code unisolated, by name only).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rlvr.envs.coding.edits import EditRefused, apply_edits, parse_edits
from rlvr.envs.coding.repos import defining_module, make_rows, view
from rlvr.envs.coding.runner import TestReport, TestRunner
from rlvr.envs.parsing import last_assistant_text
from rlvr.reward import Score

NAME = "coding"
WEIGHTS = {"resolved": 1.0}


class CodingEnv:
    """Edits in, test results out; see the module doc. ``isolation``, ``timeout_s`` (a whole test run)
    and ``memory_mb`` configure the sandbox, ``test_s`` bounds each test, ``max_edits`` a reply."""

    name = NAME

    def __init__(self, *, isolation: str = "bwrap", timeout_s: float = 30.0, memory_mb: int = 512,
                 test_s: float = 2.0, max_edits: int = 3) -> None:
        if isinstance(max_edits, bool) or not isinstance(max_edits, int) or max_edits < 1:
            raise ValueError(f"CodingEnv: max_edits must be an integer >= 1, got {max_edits!r}")
        self.max_edits = max_edits
        self.runner = TestRunner({"isolation": isolation, "timeout_s": timeout_s, "memory_mb": memory_mb},
                                 test_s=test_s)

    def score_reply(self, reply: str, files: Mapping[str, str], tests: Sequence[str]) -> tuple[Score, str | None]:
        """The reply's score on the repository, and why it was refused (``None`` when it ran)."""
        sources = tuple(path for path in files if path not in tests)
        try:
            edited = apply_edits(dict(files), sources, parse_edits(reply, max_edits=self.max_edits))
        except EditRefused as exc:
            components = {"resolved": 0.0, "pass_rate": 0.0, "refused": 1.0, "timed_out": 0.0}
            return Score(components, WEIGHTS), str(exc)
        report = self.runner.run(edited, tests)
        timed_out = float(report.error is not None and "TimeoutError" in report.error)
        components = {"resolved": float(report.all_pass), "pass_rate": report.pass_rate, "refused": 0.0,
                      "timed_out": timed_out}
        return Score(components, WEIGHTS), None

    def reward_fn(self, messages: Sequence[Mapping[str, Any]], answer: Any, info: Mapping[str, Any]) -> Score:
        files, tests = _repository(info)
        return self.score_reply(last_assistant_text(messages, who="CodingEnv.reward_fn"), files, tests)[0]

    def make_rows(self, n: int, *, seed: int, **options: Any) -> list[dict[str, Any]]:
        """Procedural repositories with a planted bug (:func:`rlvr.envs.coding.repos.make_rows`)."""
        return make_rows(n, seed=seed, **options)

    def describe(self) -> dict[str, Any]:
        return {"type": f"{__name__}.CodingEnv", "reward": "all tests pass", "max_edits": self.max_edits,
                "test_s": self.runner.test_s, "sandbox": self.runner.sandbox.describe()}


def _repository(info: Mapping[str, Any]) -> tuple[dict[str, str], list[str]]:
    files, tests = info.get("files"), info.get("tests")
    if not isinstance(files, Mapping) or not isinstance(tests, Sequence) or isinstance(tests, str):
        raise ValueError(f"CodingEnv: the row's info needs files (path -> text) and tests (a list of test files); "
                         f"got keys {sorted(info)}")
    return dict(files), list(tests)


def agent_view(runner: TestRunner, files: Mapping[str, str], tests: Sequence[str]) -> tuple[str | None, TestReport]:
    """What an agent shows its model after running the tests: the module defining the first failing
    test's function, numbered, and the failing assertion (:func:`rlvr.envs.coding.repos.view`); ``None``
    when every test passes or the failure names no function of the repository. With the report."""
    report = runner.run(files, tests)
    failure = report.first_failure()
    if failure is None:
        return None, report
    detail = failure[1]
    function = detail.split("(", 1)[0].strip()
    module = defining_module(dict(files), function, tests) if function.isidentifier() else None
    if module is None:
        return None, report
    return view(module, files[module], detail), report


def load_environment(**kwargs: Any) -> CodingEnv:
    """The factory :func:`rlvr.envs.loading.load_environment` calls with ``task.env_args``."""
    return CodingEnv(**kwargs)
