"""A safe calculator for tool environments: arithmetic by walking the syntax tree, never ``eval``.

Numbers, ``+ - * / // % **``, parentheses, unary ``+``/``-``, the functions ``abs round min max
sqrt`` and the constants ``pi e``. Integers and fractions are exact (``1/3*3`` is ``1``); a float
operand makes the result a float. Sizes are bounded before computing (``max_bits`` per number,
expression length, tree depth), so ``9**9**9`` is refused at once instead of hanging.

Standard library only.
"""

from __future__ import annotations

import ast
import math
from fractions import Fraction
from typing import Any, ClassVar

from rlvr.errors import CalculatorError

Number = int | Fraction | float


class Calculator:
    """Safe arithmetic: ``Calculator()("2**10 / 4")`` → ``"256"``; refusals raise :class:`CalculatorError`.

    ``max_bits``: the largest integer/numerator/denominator allowed, in bits, checked *before*
    each power and after every operation. ``max_length``: the longest expression accepted.
    ``max_depth``: the deepest syntax tree accepted.
    """

    FUNCTIONS: ClassVar[tuple[str, ...]] = ("abs", "round", "min", "max", "sqrt")
    CONSTANTS: ClassVar[dict[str, float]] = {"pi": math.pi, "e": math.e}

    def __init__(self, *, max_bits: int = 4096, max_length: int = 500, max_depth: int = 64) -> None:
        for field, value in (("max_bits", max_bits), ("max_length", max_length), ("max_depth", max_depth)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 8:
                raise ValueError(f"Calculator: {field} must be an integer >= 8, got {value!r}")
        self.max_bits, self.max_length, self.max_depth = max_bits, max_length, max_depth

    def __call__(self, expression: str) -> str:
        return format_number(self.evaluate(expression))

    def evaluate(self, expression: str) -> Number:
        if not isinstance(expression, str):
            raise CalculatorError(f"expected an expression string, got {type(expression).__name__}")
        text = expression.strip()
        if not text:
            raise CalculatorError("empty expression")
        if len(text) > self.max_length:
            raise CalculatorError(f"expression longer than {self.max_length} characters")
        try:
            tree = ast.parse(text, mode="eval")
        except SyntaxError as exc:
            raise CalculatorError(f"invalid syntax: {exc.msg}") from None
        except (RecursionError, MemoryError, ValueError):
            raise CalculatorError("expression too deeply nested") from None
        try:
            return self._eval(tree.body, 0)
        except OverflowError:
            raise CalculatorError("result too large for a float") from None

    # -- the walk

    def _eval(self, node: ast.AST, depth: int) -> Number:
        if depth > self.max_depth:
            raise CalculatorError(f"expression nested deeper than {self.max_depth}")
        if isinstance(node, ast.Constant):
            const = node.value
            if isinstance(const, bool) or not isinstance(const, (int, float)):
                raise CalculatorError(f"only numbers are allowed, got {type(const).__name__} {const!r:.40}")
            return self._checked(const)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
            value = self._eval(node.operand, depth + 1)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp):
            left, right = self._eval(node.left, depth + 1), self._eval(node.right, depth + 1)
            return self._checked(self._binop(node.op, left, right))
        if isinstance(node, ast.Name):
            if node.id in self.CONSTANTS:
                return self.CONSTANTS[node.id]
            raise CalculatorError(f"name {node.id!r} is not allowed; constants: {', '.join(self.CONSTANTS)}")
        if isinstance(node, ast.Call):
            return self._checked(self._call(node, depth))
        if isinstance(node, ast.Tuple):
            raise CalculatorError("a tuple is not a number (write one expression)")
        raise CalculatorError(f"unsupported syntax: {type(node).__name__}")

    def _binop(self, op: ast.operator, a: Number, b: Number) -> Number:
        if isinstance(op, ast.Add):
            return a + b
        if isinstance(op, ast.Sub):
            return a - b
        if isinstance(op, ast.Mult):
            return a * b
        if isinstance(op, (ast.Div, ast.FloorDiv, ast.Mod)):
            if b == 0:
                raise ZeroDivisionError("division by zero")
            if isinstance(op, ast.Div):
                return a / b if isinstance(a, float) or isinstance(b, float) else Fraction(a) / Fraction(b)
            return a // b if isinstance(op, ast.FloorDiv) else a % b
        if isinstance(op, ast.Pow):
            return self._pow(a, b)
        if isinstance(op, ast.BitXor):
            raise CalculatorError("'^' is not a power here; write ** (2**10)")
        raise CalculatorError(f"unsupported operator: {type(op).__name__}")

    def _pow(self, base: Number, exponent: Number) -> Number:
        if isinstance(exponent, Fraction) and exponent.denominator == 1:
            exponent = exponent.numerator
        if isinstance(exponent, int) and not isinstance(base, float):
            frac = Fraction(base)
            size = max(math.log2(abs(frac.numerator)) if frac.numerator else 0.0, math.log2(frac.denominator))
            if size * abs(exponent) > self.max_bits:  # the result's size, estimated before computing it
                raise CalculatorError(f"result too large (more than {self.max_bits} bits)")
            if exponent < 0:
                if base == 0:
                    raise ZeroDivisionError("zero to a negative power")
                return 1 / (Fraction(base) ** -exponent)
            return base**exponent
        try:
            result = float(base) ** float(exponent)
        except OverflowError:
            raise CalculatorError("result too large for a float") from None
        except ZeroDivisionError:
            raise ZeroDivisionError("zero to a negative power") from None
        if isinstance(result, complex):
            raise CalculatorError("complex result (a negative number to a fractional power)")
        return result

    def _call(self, node: ast.Call, depth: int) -> Number:
        if not isinstance(node.func, ast.Name) or node.func.id not in self.FUNCTIONS:
            what = node.func.id if isinstance(node.func, ast.Name) else type(node.func).__name__
            raise CalculatorError(f"function {what!r} is not allowed; functions: {', '.join(self.FUNCTIONS)}")
        if node.keywords:
            raise CalculatorError("keyword arguments are not allowed")
        if any(isinstance(arg, ast.Starred) for arg in node.args):
            raise CalculatorError("unsupported syntax: Starred")
        name = node.func.id
        args = [self._eval(arg, depth + 1) for arg in node.args]
        arity = {"abs": (1, 1), "round": (1, 2), "sqrt": (1, 1), "min": (1, 64), "max": (1, 64)}[name]
        if not arity[0] <= len(args) <= arity[1]:
            raise CalculatorError(f"{name} takes {arity[0]}..{arity[1]} arguments, got {len(args)}")
        if name == "abs":
            return self._checked(abs(args[0]))  # checked, as every result: to mypy it is an object
        if name == "min":
            return self._checked(min(args))
        if name == "max":
            return self._checked(max(args))
        if name == "sqrt":
            return _sqrt(args[0])
        digits = args[1] if len(args) == 2 else None
        if digits is not None:
            if isinstance(digits, Fraction) and digits.denominator == 1:
                digits = digits.numerator
            if not isinstance(digits, int) or abs(digits) > 100:
                raise CalculatorError("round's digits must be an integer between -100 and 100")
            return self._checked(round(args[0], digits))
        return round(args[0])

    def _checked(self, value: Any) -> Number:
        if isinstance(value, Fraction):
            if value.denominator == 1:
                value = value.numerator
            elif max(_bits(value.numerator), _bits(value.denominator)) > self.max_bits:
                raise CalculatorError(f"result too large (more than {self.max_bits} bits)")
        if isinstance(value, int) and _bits(value) > self.max_bits:
            raise CalculatorError(f"result too large (more than {self.max_bits} bits)")
        if isinstance(value, float) and not math.isfinite(value):
            raise CalculatorError("result is not finite (overflow)")
        return value


def _bits(value: int | Fraction) -> int:
    if isinstance(value, Fraction):
        return max(abs(value.numerator).bit_length(), value.denominator.bit_length())
    return abs(value).bit_length()


def _sqrt(value: Number) -> Number:
    if value < 0:
        raise CalculatorError("sqrt of a negative number")
    if isinstance(value, (int, Fraction)):
        frac = Fraction(value)
        num, den = math.isqrt(frac.numerator), math.isqrt(frac.denominator)
        if num * num == frac.numerator and den * den == frac.denominator:
            return Fraction(num, den)
    try:
        return math.sqrt(value)
    except OverflowError:
        raise CalculatorError("result too large for a float") from None


def format_number(value: Number) -> str:
    """A number as the calculator shows it: integers exactly, terminating fractions as exact
    decimals (up to 30 places), other fractions and floats to 15 significant digits."""
    if isinstance(value, Fraction) and value.denominator == 1:
        value = value.numerator
    if isinstance(value, int):
        return str(value)
    if isinstance(value, Fraction):
        den, twos, fives = value.denominator, 0, 0
        while den % 2 == 0:
            den, twos = den // 2, twos + 1
        while den % 5 == 0:
            den, fives = den // 5, fives + 1
        places = max(twos, fives)
        if den == 1 and places <= 30:
            scaled = abs(value.numerator) * (10**places // value.denominator)
            digits = str(scaled).rjust(places + 1, "0")
            text = f"{digits[:-places]}.{digits[-places:]}".rstrip("0").rstrip(".")
            return ("-" if value < 0 else "") + text
        try:
            approx = float(value)
        except OverflowError:
            return f"{value.numerator}/{value.denominator}"
    else:
        approx = value
    text = format(approx, ".15g")
    return "0" if text == "-0" else text
