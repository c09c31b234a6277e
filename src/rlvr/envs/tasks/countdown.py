"""Procedural countdown: reach a target from a few numbers with ``+ - * /``.

Rows look like ``{"prompt": "22 from 3,5,7=", "answer": "3*5+7", "info": {...}}``. The answer
is a *reference* solution: the verifier accepts any expression that uses each given number at
most once (a number given twice may be used twice) and equals the target exactly, so
``"7+3*5"`` scores like ``"3*5+7"``. The numbers and the target are read back from the
reference, so ``reward_fn(messages, answer)`` needs nothing else; a mapping
``{"numbers": [3, 5, 7], "target": 22}`` is accepted as the answer too.

Expressions are checked by walking their syntax tree (numbers, ``+ - * /`` and parentheses
only; no unary minus, no names, no calls) and evaluated exactly with fractions, never with
``eval``. Division is exact (``7/2`` is 3.5), and dividing by zero makes the reply invalid.

Rows are a pure function of ``(seed, index, options)`` as in :mod:`rlvr.envs.tasks.arithmetic`:
``make_rows(10, seed=s)[:5] == make_rows(5, seed=s)``. Reference solutions use every number,
keep every intermediate result a non-negative integer, and never equal a single given number.

Difficulty: ``level`` picks a preset from :data:`LEVELS` (default 2: three numbers 1-9 with
``+ - *``; references at most ~11 characters); explicit options override the preset.
:data:`ARITHMETIC_LEVELS` documents the same scale for :mod:`rlvr.envs.tasks.arithmetic`'s options.

Standard library only.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from fractions import Fraction
from numbers import Integral
from typing import Any

from rlvr.envs.parsing import last_assistant_text
from rlvr.seeding import rng_for

NAME = "countdown"
OPERATORS = ("+", "-", "*", "/")
LEVELS: dict[int, dict[str, Any]] = {
    1: {"count": 2, "max_number": 9, "ops": ("+", "-")},
    2: {"count": 3, "max_number": 9, "ops": ("+", "-", "*")},
    3: {"count": 4, "max_number": 9, "ops": ("+", "-", "*")},
    4: {"count": 4, "max_number": 20, "ops": ("+", "-", "*", "/")},
}
DEFAULT_LEVEL = 2
# The same 1-4 scale for arithmetic.make_rows (its own defaults are level 2). Pass the dict as
# options: arithmetic.make_rows(n, seed=s, **ARITHMETIC_LEVELS[3]).
ARITHMETIC_LEVELS: dict[int, dict[str, Any]] = {
    1: {"digits": 1, "operands": 2, "ops": ("+",)},
    2: {"digits": 2, "operands": 2, "ops": ("+",)},
    3: {"digits": 2, "operands": 3, "ops": ("+", "-")},
    4: {"digits": 2, "operands": 3, "ops": ("+", "-", "*")},
}

MAX_EXPRESSION_CHARS = 200  # longer replies are not parsed at all
_EXPRESSION_CHARS = re.compile(r"[0-9+\-*/() \t]+")
_MAX_DRAWS = 1000
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}
_AST_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


def make_rows(
    n: int,
    *,
    seed: int,
    level: int | None = None,
    count: int | None = None,
    max_number: int | None = None,
    ops: Sequence[str] | None = None,
    max_target: int | None = None,
) -> list[dict[str, Any]]:
    """``n`` countdown rows, deterministic from ``seed`` and the options.

    ``level``: a preset from :data:`LEVELS` (default 2); the options below override it.
    ``count``: how many numbers are given (2 to 6). ``max_number``: numbers are drawn from
    1..max_number. ``ops``: operators the reference solutions use, a subset of ``+ - * /``.
    ``max_target``: largest allowed target (default: no bound).
    """
    options = _resolve(n, level, count, max_number, ops, max_target)
    return [_make_row(seed, i, options) for i in range(n)]


def _resolve(n: int, level: int | None, count: int | None, max_number: int | None,
             ops: Sequence[str] | None, max_target: int | None) -> tuple:
    if n < 0:
        raise ValueError(f"countdown: n must be >= 0, got {n}")
    if level is not None and level not in LEVELS:
        raise ValueError(f"countdown: level must be one of {sorted(LEVELS)}, got {level!r}")
    preset = LEVELS[DEFAULT_LEVEL if level is None else level]
    count = preset["count"] if count is None else count
    max_number = preset["max_number"] if max_number is None else max_number
    ops = tuple(preset["ops"] if ops is None else ops)
    if not 2 <= count <= 6:
        raise ValueError(f"countdown: count must be between 2 and 6, got {count}")
    if max_number < 2:
        raise ValueError(f"countdown: max_number must be >= 2, got {max_number}")
    if not ops or any(op not in OPERATORS for op in ops):
        raise ValueError(f"countdown: ops must be a non-empty subset of {OPERATORS}, got {ops!r}")
    if max_target is not None and max_target < 1:
        raise ValueError(f"countdown: max_target must be >= 1, got {max_target}")
    return count, max_number, ops, max_target, level


def _make_row(seed: int, index: int, options: tuple) -> dict[str, Any]:
    count, max_number, ops, max_target, level = options
    rng = rng_for(seed, NAME, index)
    for _ in range(_MAX_DRAWS):
        numbers = [rng.randint(1, max_number) for _ in range(count)]
        order = numbers[:]
        rng.shuffle(order)
        tree = _random_tree(rng, order, ops)
        value = _value_of_tree(tree)
        if value is None or value < 1 or value in numbers or (max_target is not None and value > max_target):
            continue
        target = int(value)
        prompt = f"{target} from {','.join(map(str, numbers))}="
        info = {"task": NAME, "index": index, "numbers": numbers, "target": target, "level": level}
        return {"prompt": prompt, "answer": _render(tree), "info": info}
    raise ValueError(f"countdown: no usable target in {_MAX_DRAWS} draws for count={count}, "
                     f"max_number={max_number}, ops={ops!r}, max_target={max_target}; loosen the options")


def _random_tree(rng: Any, leaves: list[int], ops: tuple[str, ...]) -> Any:
    if len(leaves) == 1:
        return leaves[0]
    cut = rng.randint(1, len(leaves) - 1)
    return (rng.choice(ops), _random_tree(rng, leaves[:cut], ops), _random_tree(rng, leaves[cut:], ops))


def _value_of_tree(node: Any) -> int | None:
    """The tree's value when every intermediate result is a non-negative integer, else None."""
    if isinstance(node, int):
        return node
    op, left, right = node
    a, b = _value_of_tree(left), _value_of_tree(right)
    if a is None or b is None:
        return None
    if op == "+":
        out = a + b
    elif op == "-":
        out = a - b
    elif op == "*":
        out = a * b
    else:
        if b == 0 or a % b:
            return None
        out = a // b
    return out if out >= 0 else None


def _render(node: Any, parent: str | None = None, right: bool = False) -> str:
    if isinstance(node, int):
        return str(node)
    op, left, right_node = node
    text = _render(left, op, False) + op + _render(right_node, op, True)
    if parent is None:
        return text
    weaker = _PRECEDENCE[op] < _PRECEDENCE[parent]
    same_on_right = right and _PRECEDENCE[op] == _PRECEDENCE[parent] and parent in "-/"
    return f"({text})" if weaker or same_on_right else text


# -------------------------------------------------------------------------------------- verifier


def parse_expression(text: str) -> tuple[Fraction | None, list[int]] | None:
    """``(value, numbers used)`` of an expression, or None when it is not one.

    Only non-negative integer literals, ``+ - * /`` and parentheses are allowed. ``value`` is
    None when the expression divides by zero.
    """
    if not isinstance(text, str):
        return None
    text = text.strip()
    if not text or len(text) > MAX_EXPRESSION_CHARS or not _EXPRESSION_CHARS.fullmatch(text):
        return None
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    numbers: list[int] = []
    if not _collect(tree.body, numbers):
        return None
    try:
        return _evaluate(tree.body), numbers
    except ZeroDivisionError:
        return None, numbers


def _collect(node: ast.AST, numbers: list[int]) -> bool:
    if isinstance(node, ast.Constant):
        if type(node.value) is int and node.value >= 0:
            numbers.append(node.value)
            return True
        return False
    if isinstance(node, ast.BinOp) and type(node.op) in _AST_OPS:
        return _collect(node.left, numbers) and _collect(node.right, numbers)
    return False


def _evaluate(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant):
        assert isinstance(node.value, int)  # _collect let only integer constants through
        return Fraction(node.value)
    assert isinstance(node, ast.BinOp)
    a, b = _evaluate(node.left), _evaluate(node.right)
    op = _AST_OPS[type(node.op)]
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return a / b


def parse_answer(text: str) -> str | None:
    """The expression a reply states (whitespace removed), or None when the reply is not one.

    The whole reply, stripped, must be the expression: ``"3*5+7"`` parses, ``"3*5+7=22"`` and
    ``"it is 3*5+7"`` do not.
    """
    parsed = parse_expression(text)
    return None if parsed is None else "".join(text.split())


def puzzle(answer: Any) -> tuple[list[int], int]:
    """``(numbers, target)`` from a row's answer: a reference expression or a mapping."""
    if isinstance(answer, Mapping):
        numbers, target = answer.get("numbers"), answer.get("target")
        if (not isinstance(numbers, Sequence) or isinstance(numbers, str) or not numbers
                or not all(isinstance(x, Integral) and not isinstance(x, bool) and int(x) >= 0 for x in numbers)
                or not isinstance(target, Integral) or isinstance(target, bool)):
            raise ValueError(f"countdown: an answer mapping needs 'numbers' (non-negative integers) and an "
                             f"integer 'target', got {dict(answer)!r}")
        return [int(x) for x in numbers], int(target)
    parsed = parse_expression(answer) if isinstance(answer, str) else None
    if parsed is None or parsed[0] is None or parsed[0].denominator != 1:
        raise ValueError(f"countdown: the answer {answer!r} is not a reference expression with an integer value "
                         "(or a mapping with 'numbers' and 'target')")
    return parsed[1], int(parsed[0])


def reward_fn(messages: Sequence[Mapping[str, Any]], answer: str | Mapping[str, Any]) -> float:
    """1.0 when the last assistant message is an expression over the puzzle's numbers (each at
    most once) whose exact value is the target, else 0.0. Unparsable replies are 0.0; a bad
    answer or a conversation with no assistant message raises."""
    numbers, target = puzzle(answer)
    parsed = parse_expression(last_assistant_text(messages, who="countdown.reward_fn"))
    if parsed is None or parsed[0] is None:
        return 0.0
    value, used = parsed
    if Counter(used) - Counter(numbers):
        return 0.0
    return 1.0 if value == target else 0.0
