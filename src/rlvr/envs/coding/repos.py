"""Procedural repositories with a planted bug: the coding task's rows, drawn with no download.

A task is a small Python repository (a few files, no package to install): two source modules
and one test file per module. One function of the first module is broken, either a **wrong**
body (an operator, an operand or a constant changed: ``return a - b`` in ``add``) or a **missing**
one (``pass``); its test fails and every other test passes. The row carries the repository in
``info["files"]`` (path -> text), the test files in ``info["tests"]``, and the reference fix as its
``answer``, written in the edit format of :mod:`rlvr.envs.coding.edits` (``calc.py:2:    return a + b``),
which is what the warm start teaches.

The prompt is the view a coding agent builds after running the tests (see :func:`view`): the
module that defines the failing function, numbered, and the first failing assertion::

    calc.py
    1 def add(a, b):
    2     return a - b
    3 def inc(a):
    4     return a + 1
    FAIL add(2, 3) == 5

Sized for the character-level demo model (a prompt of about 100 characters, an answer of about 25).
Each test holds three assertions, only the first failing one shown, with at least two distinct
expected values, so a body that returns the shown value does not pass.

Invariants: rows are a pure function of ``(seed, index, options)`` (a shorter draw is a prefix of a
longer one); in every row the planted bug fails its test and the reference fix passes all tests
(checked in the sandbox by the tests). Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rlvr.seeding import rng_for

NAME = "coding"
KINDS = ("wrong", "missing")
MODULES = ("calc", "ops", "nums", "mathx", "arith", "funcs")
ASSERTS_PER_TEST = 3
INDENT = "    "
_FAIL = "FAIL "


@dataclass(frozen=True, slots=True)
class Function:
    """A catalog entry: ``def name(params): return body``, and the wrong bodies a bug plants."""

    name: str
    params: tuple[str, ...]
    body: str
    wrong: tuple[str, ...]

    def source(self, body: str | None = None) -> list[str]:
        return [f"def {self.name}({', '.join(self.params)}):", f"{INDENT}{body or 'return ' + self.body}"]

    def call(self, body: str, args: Sequence[int]) -> Any:
        """The value of ``body`` at ``args``: the catalog's own text, compiled once here, so the shown code
        and the expected values can never disagree. Only catalog constants reach this."""
        fn = eval(f"lambda {', '.join(self.params)}: {body}", {"__builtins__": {"min": min, "max": max}})  # noqa: S307
        return fn(*args)


CATALOG: tuple[Function, ...] = (
    Function("add", ("a", "b"), "a + b", ("a - b", "a * b", "a + a")),
    Function("sub", ("a", "b"), "a - b", ("b - a", "a + b")),
    Function("mul", ("a", "b"), "a * b", ("a + b", "a * a")),
    Function("inc", ("a",), "a + 1", ("a - 1", "a + 2")),
    Function("dec", ("a",), "a - 1", ("a + 1", "a - 2")),
    Function("double", ("a",), "a * 2", ("a * 3", "a + 2")),
    Function("square", ("a",), "a * a", ("a + a", "a * 2")),
    Function("neg", ("a",), "-a", ("a", "a - 1")),
    Function("big", ("a", "b"), "max(a, b)", ("min(a, b)",)),
    Function("small", ("a", "b"), "min(a, b)", ("max(a, b)",)),
    Function("half", ("a",), "a // 2", ("a // 3", "a * 2")),
    Function("is_pos", ("a",), "a > 0", ("a < 0", "a >= 0")),
    Function("is_even", ("a",), "a % 2 == 0", ("a % 2 == 1",)),
    Function("same", ("a", "b"), "a == b", ("a != b", "a > b")),
)
_BY_NAME = {f.name: f for f in CATALOG}
_MAX_DRAWS = 200


def make_rows(n: int, *, seed: int, functions: int = 2, kinds: Sequence[str] = KINDS,
              max_value: int = 9) -> list[dict[str, Any]]:
    """``n`` coding rows, deterministic from ``seed`` and the options.

    ``functions``: functions in the module with the bug (1-4; the other module has two).
    ``kinds``: the bugs to plant, from :data:`KINDS`. ``max_value``: test arguments are drawn from
    ``0..max_value`` (``is_pos`` and ``neg`` also get negative ones).
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"coding: n must be an integer >= 0, got {n!r}")
    if isinstance(functions, bool) or not isinstance(functions, int) or not 1 <= functions <= 4:
        raise ValueError(f"coding: functions must be an integer in 1..4, got {functions!r}")
    kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds)
    if not kinds or any(k not in KINDS for k in kinds):
        raise ValueError(f"coding: kinds must name some of {KINDS}, got {kinds!r}")
    if isinstance(max_value, bool) or not isinstance(max_value, int) or max_value < 3:
        raise ValueError(f"coding: max_value must be an integer >= 3, got {max_value!r}")
    return [_make_row(seed, i, functions, kinds, max_value) for i in range(n)]


def _make_row(seed: int, index: int, functions: int, kinds: tuple[str, ...], max_value: int) -> dict[str, Any]:
    rng = rng_for(seed, NAME, index)
    first, second = rng.sample(MODULES, 2)
    picked = rng.sample(CATALOG, functions + 2)
    mine, other = picked[:functions], picked[functions:]
    target = rng.randrange(functions)
    kind = rng.choice(kinds)
    broken = mine[target]
    bad = "pass" if kind == "missing" else "return " + rng.choice(broken.wrong)
    cases = {f.name: _cases(rng, f, max_value) for f in picked}
    lines: list[str] = []
    for i, f in enumerate(mine):
        lines += f.source(bad if i == target else None)
    files = {
        f"{first}.py": _text(lines),
        f"{second}.py": _text([line for f in other for line in f.source()]),
        f"test_{first}.py": _tests(first, mine, cases),
        f"test_{second}.py": _tests(second, other, cases),
    }
    line = 2 * target + 2
    failing = next(_assertion(broken, args) for args in cases[broken.name]
                   if kind == "missing" or broken.call(bad.removeprefix("return "), args) != broken.call(broken.body,
                                                                                                       args))
    info = {"task": NAME, "index": index, "files": files, "tests": sorted(p for p in files if p.startswith("test_")),
            "module": f"{first}.py", "function": broken.name, "line": line, "kind": kind}
    answer = f"{first}.py:{line}:{INDENT}return {broken.body}"
    return {"prompt": view(f"{first}.py", files[f"{first}.py"], failing), "answer": answer, "info": info}


def _cases(rng: Any, f: Function, max_value: int) -> list[tuple[int, ...]]:
    """Three argument tuples on which every wrong body of ``f`` (and ``pass``) fails at least once and
    the right answers are not all one value (so returning the shown value fails)."""
    low = -max_value if f.name in ("is_pos", "neg") else 0
    for _ in range(_MAX_DRAWS):
        cases = [tuple(rng.randint(low, max_value) for _ in f.params) for _ in range(ASSERTS_PER_TEST)]
        right = [f.call(f.body, args) for args in cases]
        caught = all(any(f.call(w, args) != r for args, r in zip(cases, right, strict=True)) for w in f.wrong)
        if caught and len(set(map(repr, right))) > 1 and None not in right:
            return cases
    raise ValueError(f"coding: no test cases for {f.name} in {_MAX_DRAWS} draws")  # pragma: no cover


def _assertion(f: Function, args: Sequence[int]) -> str:
    return f"{f.name}({', '.join(map(str, args))}) == {f.call(f.body, args)!r}"


def _tests(module: str, functions: Sequence[Function], cases: dict[str, list[tuple[int, ...]]]) -> str:
    lines = [f"from {module} import {', '.join(f.name for f in functions)}"]
    for f in functions:
        lines.append(f"def test_{f.name}():")
        lines += [f"{INDENT}assert {_assertion(f, args)}" for args in cases[f.name]]
    return _text(lines)


def _text(lines: Sequence[str]) -> str:
    return "\n".join(lines) + "\n"


def view(path: str, text: str, failing: str) -> str:
    """What the model is shown: ``path``, its lines numbered from 1, and the failing assertion."""
    numbered = [f"{i} {line}" for i, line in enumerate(text.splitlines(), 1)]
    return "\n".join([path, *numbered, _FAIL + failing])


def defining_module(files: dict[str, str], function: str, tests: Sequence[str]) -> str | None:
    """The source file (not a test) that defines ``function``: how an agent finds what to open."""
    pattern = re.compile(rf"^def {re.escape(function)}\(", re.MULTILINE)
    found = [path for path, text in sorted(files.items()) if path not in tests and pattern.search(text)]
    return found[0] if len(found) == 1 else None


def catalog_function(name: str) -> Function | None:
    return _BY_NAME.get(name)
