"""Procedural word problems in the style of GSM8K: a few named people, quantities, 2-3 operations.

Rows look like ``{"prompt": "Mia has 7 marbles. She buys 5 more and gives 3 to Leo. How many marbles
does Mia have now?", "answer": "9", "info": {...}}``; ``info.solution`` holds a worked solution ending in
a ``#### N`` line (GSM8K's answer format), ``info.template`` the template's name. Generated locally
from the seed: no download.

Invariants:
- Rows are a pure function of ``(seed, n_before, options)``: row ``i`` draws from its own
  ``random.Random`` seeded from ``(seed, i)`` and redraws while its template and numbers repeat an
  earlier row's, so ``make_rows(10, seed=s)[:5] == make_rows(5, seed=s)``.
- No two rows share a template and its numbers: the held-out split's twin rule (same numbers in
  order and near-identical words) finds no twins to keep together, so every row is its own cluster.
- Every answer is a non-negative integer, every intermediate quantity too (nobody gives away more
  than they have; shares divide exactly).

Difficulty is the operation count: ``level`` 1 keeps the 2-operation templates, 2 (default) mixes
2- and 3-operation ones, 3 keeps the 3-operation ones; and the size of the numbers: ``max_number``
caps every quantity a template draws (a range reaching past it is cut there, one starting past it is
drawn at its start), so a small model's arithmetic is not the whole difficulty. The bill of the
``change`` template (20, 50 or 100) and the results are not capped.

The reward reads the number after the reply's last ``####`` when there is one, else the last number
in the reply (a small instruct model rarely writes the marker unasked; both count), and pays 1.0
when it equals the answer. Standard library only.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlvr.envs.parsing import last_assistant_text, last_number
from rlvr.reward import Score
from rlvr.seeding import derive_seed, rng_for

NAME = "word_problems"
_MAX_DRAWS = 1000
_MARKED = re.compile(r"####\s*(-?[0-9][0-9,]*(?:\.[0-9]+)?)")

PEOPLE = (("Mia", "She"), ("Leo", "He"), ("Ava", "She"), ("Noah", "He"), ("Zoe", "She"), ("Omar", "He"),
          ("Lily", "She"), ("Ben", "He"), ("Sara", "She"), ("Ravi", "He"), ("Emma", "She"), ("Jack", "He"),
          ("Nina", "She"), ("Tom", "He"), ("Ines", "She"), ("Sam", "He"))
THINGS = ("apples", "marbles", "stickers", "pencils", "cookies", "books", "shells", "cards", "eggs",
          "candles", "buttons", "coins", "plums", "stamps", "balloons", "beads")

Problem = tuple[str, list[str], int]  # question, solution lines, answer
Template = Callable[[Any, list[tuple[str, str]], str], tuple[Problem, tuple[int, ...]]]


def _buy_give(rng: Any, p: list[tuple[str, str]], t: str) -> tuple[Problem, tuple[int, ...]]:
    (a, he), (b, _) = p[0], p[1]
    x, y = rng.randint(3, 20), rng.randint(2, 15)
    z = rng.randint(1, x + y - 1)
    q = f"{a} has {x} {t}. {he} buys {y} more and gives {z} to {b}. How many {t} does {a} have now?"
    return (q, [f"{x} + {y} = {x + y}", f"{x + y} - {z} = {x + y - z}"], x + y - z), (x, y, z)


def _boxes_eaten(rng: Any, p: list[tuple[str, str]], t: str) -> tuple[Problem, tuple[int, ...]]:
    (a, he) = p[0]
    x, y = rng.randint(2, 9), rng.randint(2, 9)
    z = rng.randint(1, x * y - 1)
    q = f"{a} buys {x} bags of {t}. Each bag holds {y} {t}. {he} loses {z} of them. How many {t} are left?"
    return (q, [f"{x} * {y} = {x * y}", f"{x * y} - {z} = {x * y - z}"], x * y - z), (x, y, z)


def _change(rng: Any, p: list[tuple[str, str]], t: str) -> tuple[Problem, tuple[int, ...]]:
    (a, he) = p[0]
    x, y = rng.randint(2, 9), rng.randint(2, 9)
    z = rng.choice([v for v in (20, 50, 100) if v >= x * y])
    q = (f"{a} buys {x} {t} that cost ${y} each and pays with a ${z} bill. "
         f"How many dollars of change does {he.lower()} get?")
    return (q, [f"{x} * {y} = {x * y}", f"{z} - {x * y} = {z - x * y}"], z - x * y), (x, y, z)


def _share(rng: Any, p: list[tuple[str, str]], t: str) -> tuple[Problem, tuple[int, ...]]:
    (a, he) = p[0]
    z = rng.randint(2, 6)
    total = z * rng.randint(2, 9)
    x = rng.randint(1, total - 1)
    y = total - x
    q = (f"{a} collects {x} {t} on Monday and {y} {t} on Tuesday. {he} shares them equally among "
         f"{z} friends. How many {t} does each friend get?")
    return (q, [f"{x} + {y} = {total}", f"{total} / {z} = {total // z}"], total // z), (x, y, z)


def _more_than(rng: Any, p: list[tuple[str, str]], t: str) -> tuple[Problem, tuple[int, ...]]:
    (a, _), (b, _) = p[0], p[1]
    x, y = rng.randint(3, 30), rng.randint(2, 15)
    q = f"{a} has {x} {t}. {b} has {y} more {t} than {a}. How many {t} do they have together?"
    return (q, [f"{x} + {y} = {x + y}", f"{x} + {x + y} = {2 * x + y}"], 2 * x + y), (x, y)


def _daily(rng: Any, p: list[tuple[str, str]], t: str) -> tuple[Problem, tuple[int, ...]]:
    (a, he) = p[0]
    x, y, z = rng.randint(2, 9), rng.randint(2, 7), rng.randint(2, 20)
    q = f"{a} makes {x} {t} a day for {y} days. Then {he.lower()} makes {z} more. How many {t} does {a} make in all?"
    return (q, [f"{x} * {y} = {x * y}", f"{x * y} + {z} = {x * y + z}"], x * y + z), (x, y, z)


def _twice_fewer(rng: Any, p: list[tuple[str, str]], t: str) -> tuple[Problem, tuple[int, ...]]:
    (a, _), (b, _), (c, _) = p[0], p[1], p[2]
    x = rng.randint(2, 15)
    y = rng.randint(1, 2 * x - 1)
    q = (f"{a} has {x} {t}. {b} has twice as many {t} as {a}. {c} has {y} fewer {t} than {b}. "
         f"How many {t} do the three of them have in total?")
    lines = [f"2 * {x} = {2 * x}", f"{2 * x} - {y} = {2 * x - y}", f"{x} + {2 * x} + {2 * x - y} = {5 * x - y}"]
    return (q, lines, 5 * x - y), (x, y)


def _packs_split(rng: Any, p: list[tuple[str, str]], t: str) -> tuple[Problem, tuple[int, ...]]:
    (a, he), (b, _) = p[0], p[1]
    x, y = rng.randint(2, 6), rng.randint(2, 8)
    z = rng.randint(1, x * y - 1)
    w = rng.randint(1, x * y - z)
    left = x * y - z - w
    q = (f"{a} has {x} packs of {t} with {y} {t} in each pack. {he} gives {z} {t} to {b} and uses {w}. "
         f"How many {t} does {a} have left?")
    lines = [f"{x} * {y} = {x * y}", f"{x * y} - {z} = {x * y - z}", f"{x * y - z} - {w} = {left}"]
    return (q, lines, left), (x, y, z, w)


def _saves(rng: Any, p: list[tuple[str, str]], t: str) -> tuple[Problem, tuple[int, ...]]:
    (a, he) = p[0]
    x, y = rng.randint(2, 12), rng.randint(2, 6)
    start = rng.randint(0, 10)
    total = start + x * y
    z = rng.randint(1, total)
    q = (f"{a} has ${start}. {he} saves ${x} every week for {y} weeks, then spends ${z} on {t}. "
         f"How many dollars does {a} have now?")
    lines = [f"{x} * {y} = {x * y}", f"{start} + {x * y} = {total}", f"{total} - {z} = {total - z}"]
    return (q, lines, total - z), (start, x, y, z)


TWO_STEP: dict[str, Template] = {"buy_give": _buy_give, "bags_lost": _boxes_eaten, "change": _change,
                                 "share": _share, "more_than": _more_than, "daily": _daily}
THREE_STEP: dict[str, Template] = {"twice_fewer": _twice_fewer, "packs_split": _packs_split, "saves": _saves}
LEVELS: dict[int, tuple[str, ...]] = {1: tuple(TWO_STEP), 2: (*TWO_STEP, *THREE_STEP), 3: tuple(THREE_STEP)}
TEMPLATES: dict[str, Template] = {**TWO_STEP, **THREE_STEP}
DEFAULT_LEVEL = 2


class _Capped(random.Random):
    """A ``random.Random`` whose ``randint`` ranges stop at ``cap`` (a range starting past it yields
    its start): the templates' own ranges, shrunk for ``max_number``."""

    def __init__(self, seed: int, cap: int):
        super().__init__(seed)
        self.cap = cap

    def randint(self, a: int, b: int) -> int:
        return super().randint(a, max(a, min(b, self.cap)))


def make_rows(n: int, *, seed: int, level: int = DEFAULT_LEVEL, templates: Sequence[str] | None = None,
              max_number: int | None = None) -> list[dict[str, Any]]:
    """``n`` word problems, deterministic from ``seed``; ``level`` picks the templates (see the module
    docstring), ``templates`` names them instead (any of :data:`TEMPLATES`); ``max_number`` caps the
    quantities drawn (None: the templates' own ranges, up to 20)."""
    names = _templates(n, level, templates)
    if max_number is not None and (isinstance(max_number, bool) or not isinstance(max_number, int)
                                   or max_number < 2):
        raise ValueError(f"{NAME}: max_number must be an integer >= 2, got {max_number!r}")
    seen: set[tuple[str, tuple[int, ...]]] = set()
    rows = []
    for i in range(n):
        rng = rng_for(seed, NAME, i) if max_number is None else _Capped(derive_seed(seed, NAME, i), max_number)
        for _ in range(_MAX_DRAWS):
            name = rng.choice(names)
            people = rng.sample(PEOPLE, 3)
            thing = rng.choice(THINGS)
            (question, lines, answer), numbers = TEMPLATES[name](rng, people, thing)
            if (name, numbers) not in seen:
                break
        else:
            raise ValueError(f"{NAME}: no new problem in {_MAX_DRAWS} draws at row {i}: templates {names} "
                             f"have fewer distinct problems than n={n}")
        seen.add((name, numbers))
        solution = "\n".join([*lines, f"#### {answer}"])
        rows.append({"prompt": question, "answer": str(answer),
                     "info": {"task": NAME, "index": i, "template": name, "steps": len(lines),
                              "solution": solution}})
    return rows


def _templates(n: int, level: int, templates: Sequence[str] | None) -> list[str]:
    if n < 0:
        raise ValueError(f"{NAME}: n must be >= 0, got {n}")
    if templates is not None:
        unknown = [t for t in templates if t not in TEMPLATES]
        if unknown or not templates:
            raise ValueError(f"{NAME}: templates must be a non-empty list of {sorted(TEMPLATES)}, got {templates!r}")
        return list(templates)
    if level not in LEVELS:
        raise ValueError(f"{NAME}: level must be one of {sorted(LEVELS)}, got {level!r}")
    return list(LEVELS[level])


def parse_answer(text: str) -> str | None:
    """The number after the last ``####`` in ``text``, else its last number; None when it has none."""
    if not isinstance(text, str):
        return None
    marked = _MARKED.findall(text)
    found = marked[-1] if marked else last_number(text)
    return None if found is None else found.replace(",", "").rstrip(".")


def _value(text: str | None) -> float | None:
    try:
        return None if text is None else float(text)
    except ValueError:
        return None


def reward_fn(messages: Sequence[Mapping[str, Any]], answer: str | int) -> Score:
    """1.0 when the reply's final number (see :func:`parse_answer`) equals ``answer``, else 0.0; metrics
    ``parsed`` (the reply has a number) and ``marked`` (it has a ``#### N`` line)."""
    gold = _value(str(answer))
    if gold is None:
        raise ValueError(f"{NAME}.reward_fn: answer must be a number, got {answer!r}")
    reply = last_assistant_text(messages, who=f"{NAME}.reward_fn")
    got = _value(parse_answer(reply))
    return Score.of(float(got is not None and got == gold), parsed=float(got is not None),
                    marked=float(bool(_MARKED.search(reply))))
