"""A tool-use environment: the model calls a calculator or runs Python, then answers.

Tool-call format
----------------
In an assistant message, either form calls a tool (every call in the message runs, in order, up
to ``max_calls_per_turn``)::

    <tool>NAME: ARGS</tool>
    <tool_call>{"name": "NAME", "arguments": ARGS}</tool_call>

``NAME`` is a tool name or one of its aliases (``calc`` for ``calculator``, ``py`` for
``python`` by default); ``ARGS`` is the raw argument text: everything after the first colon,
stripped (multi-line Python is dedented). In the JSON form ``arguments`` (or ``parameters``) is
a string, or an object holding it under the tool's key (``expression`` for the calculator,
``code`` for Python) or as its only value. The tag name ``tool`` is configurable (``tag="t"``
gives ``<t>c:12*34</t>`` with the terse aliases), the JSON tag is always ``tool_call``.

``interact`` answers each call with ``{"role": "tool", "name": TOOL, "content": RESULT}`` (``TOOL``
the tool's own name, aliases resolved); a
failed call is still answered, with content ``"error: ExceptionName: message"`` (unknown tool,
malformed call, a ``ZeroDivisionError``, a timeout...). A message without a tool call is the
final answer: ``interact`` returns ``[]``. It also returns ``[]`` once ``state["turn"]`` reaches
``max_turns``.

Reward: the final answer (the last assistant message) is checked as in
:class:`rlvr.envs.retry.AnswerCheck` (``answer_format`` ``"boxed"``/``"plain"``/``"tags"`` with
exact match, or an ``inner`` reward); a conversation whose last assistant message is still a
tool call ran out of turns and gets ``correct = parsed = 0``. The :class:`Score` pays
``correct`` and records ``tool_calls`` (tool messages in the conversation) and ``tool_errors``
(those whose last line starts with ``error:``, see :func:`is_error`; a Python result that
prints such a line itself counts too).

Tools
-----
- :class:`Calculator`: arithmetic by walking the syntax tree (never ``eval``): numbers,
  ``+ - * / // % **``, parentheses, unary ``+``/``-``, the functions ``abs round min max sqrt``
  and the constants ``pi e``. Integers and fractions are exact (``1/3*3`` is ``1``), a float
  operand makes the result a float. Sizes are bounded before computing (``max_bits`` per number,
  expression length, tree depth), so ``9**9**9`` is refused at once instead of hanging.
- :class:`PythonSandbox`: runs code in a child interpreter; see its docstring for exactly what
  is and is not isolated.

Procedural rows (:func:`make_rows`: ``"412*37="`` → ``"15244"``) and :func:`terse` (tag ``t``,
alias ``c``, plain answers) let the CPU demo's tiny model use the calculator:
``<t>c:412*37</t>`` is 15 characters.

Standard library only.
"""

from __future__ import annotations

import ast
import functools
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, ClassVar

from rlvr.envs.contract import Score
from rlvr.envs.parsing import last_assistant_text
from rlvr.envs.retry import AnswerCheck, check_max_turns, turn_of
from rlvr.seeding import rng_for

__all__ = [
    "NAME", "Calculator", "CalculatorError", "PythonSandbox", "SandboxResult", "ToolCall", "ToolEnv",
    "format_number", "is_error", "load_environment", "make_rows", "parse_tool_calls", "terse", "unshare_available"
]

NAME = "tools"
WEIGHTS = {"correct": 1.0}
DEFAULT_ALIASES = {"calc": "calculator", "py": "python"}
TERSE_ALIASES = {"c": "calculator", "p": "python"}
ERROR_PREFIX = "error:"
_JSON_TAG = "tool_call"
_TOOL_ARG_KEYS = {"calculator": ("expression", "expr"), "python": ("code",)}

ToolFn = Callable[[str], str]


# ------------------------------------------------------------------------------------ calculator


class CalculatorError(ValueError):
    """An expression the calculator refuses or cannot evaluate (the message says why)."""


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
            value = node.value
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise CalculatorError(f"only numbers are allowed, got {type(value).__name__} {value!r:.40}")
            return self._checked(value)
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
            return abs(args[0])
        if name == "min":
            return min(args)
        if name == "max":
            return max(args)
        if name == "sqrt":
            return _sqrt(args[0])
        digits = args[1] if len(args) == 2 else None
        if digits is not None:
            if isinstance(digits, Fraction) and digits.denominator == 1:
                digits = digits.numerator
            if not isinstance(digits, int) or abs(digits) > 100:
                raise CalculatorError("round's digits must be an integer between -100 and 100")
            return round(args[0], digits)
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
            value = float(value)
        except OverflowError:
            return f"{value.numerator}/{value.denominator}"
    text = format(value, ".15g")
    return "0" if text == "-0" else text


# --------------------------------------------------------------------------------------- sandbox

# Runs in the child before any user code: limits, network/process/write guards, then the code.
# argv: cpu_s, address-space bytes, file-size bytes, the work directory.
_PRELUDE = r'''
import sys
def _rlvr_sandbox():
    import ast, builtins, io, os, resource
    cpu, mem, fsize, root = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    code = sys.stdin.buffer.read().decode("utf-8", "replace")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdin = io.StringIO("")
    sys.stdout.reconfigure(encoding="utf-8", errors="backslashreplace", line_buffering=True)
    sys.stderr.reconfigure(encoding="utf-8", errors="backslashreplace", line_buffering=True)
    for limit, value in ((resource.RLIMIT_CPU, (cpu, cpu + 1)), (resource.RLIMIT_AS, (mem, mem)),
                         (resource.RLIMIT_FSIZE, (fsize, fsize)), (resource.RLIMIT_CORE, (0, 0)),
                         (resource.RLIMIT_NOFILE, (64, 64)), (getattr(resource, "RLIMIT_NPROC", None), (0, 0))):
        if limit is not None:
            try:
                resource.setrlimit(limit, value)
            except (ValueError, OSError):
                if limit in (resource.RLIMIT_CPU, resource.RLIMIT_AS):
                    raise
    sys.dont_write_bytecode = True

    def denied(what):
        def deny(*args, **kwargs):
            raise PermissionError(f"{what} is disabled in the rlvr sandbox")
        return deny

    import socket, _socket
    class DeniedSocket(socket.socket):
        def __init__(self, *args, **kwargs):
            raise PermissionError("network access is disabled in the rlvr sandbox")
    for module in (socket, _socket):
        module.socket = module.SocketType = DeniedSocket
        for name in ("create_connection", "create_server", "socketpair", "fromfd", "getaddrinfo", "gethostbyname",
                     "gethostbyname_ex", "gethostbyaddr", "getnameinfo", "dup"):
            if hasattr(module, name):
                setattr(module, name, denied("network access"))
    for name in ("ctypes", "_ctypes"):
        sys.modules[name] = None
    import _posixsubprocess
    _posixsubprocess.fork_exec = denied("starting processes")
    for name in ("system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp", "execv", "execve", "execl",
                 "execle", "execlp", "execlpe", "execvp", "execvpe", "spawnv", "spawnve", "spawnl", "spawnle",
                 "spawnlp", "spawnlpe", "spawnvp", "spawnvpe", "kill", "killpg"):
        if hasattr(os, name):
            setattr(os, name, denied("os." + name))

    real_root = os.path.realpath(root)
    def inside(path):
        if isinstance(path, int):
            return True
        full = os.path.realpath(os.path.join(real_root, os.fsdecode(os.fspath(path))))
        return full == real_root or full.startswith(real_root + os.sep)
    def guard(path):
        if not inside(path):
            raise PermissionError(f"writing outside the sandbox directory is disabled: {path!r}")
    real_open, real_os_open = io.open, os.open
    def guarded_open(file, mode="r", *args, **kwargs):
        if any(ch in mode for ch in "wax+"):
            guard(file)
        return real_open(file, mode, *args, **kwargs)
    def guarded_os_open(path, flags, *args, **kwargs):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC):
            guard(path)
        return real_os_open(path, flags, *args, **kwargs)
    import _io
    builtins.open = io.open = _io.open = guarded_open
    os.open = guarded_os_open
    def guarded(fn, count):
        def call(*args, **kwargs):
            for path in args[:count]:
                guard(path)
            return fn(*args, **kwargs)
        return call
    for name, count in (("remove", 1), ("unlink", 1), ("rmdir", 1), ("mkdir", 1), ("makedirs", 1), ("rename", 2),
                        ("replace", 2), ("link", 2), ("symlink", 2), ("chmod", 1), ("chown", 1), ("truncate", 1),
                        ("utime", 1), ("mkfifo", 1), ("mknod", 1), ("removedirs", 1), ("renames", 2)):
        if hasattr(os, name):
            setattr(os, name, guarded(getattr(os, name), count))

    globs = {"__name__": "__main__", "__builtins__": builtins}
    try:
        tree = ast.parse(code, "<sandbox>", "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, "<sandbox>", "exec"), globs)
        if last is not None:
            value = eval(compile(last, "<sandbox>", "eval"), globs)
            if value is not None:
                print(repr(value))
    except SystemExit:
        raise
    except BaseException as exc:
        if isinstance(exc, SyntaxError):
            text = f"{exc.msg} (line {exc.lineno})"
        else:
            text = str(exc)
        sys.stdout.flush()
        sys.stderr.write(f"\nerror: {type(exc).__name__}" + (f": {text[:500]}" if text else "") + "\n")
        sys.stderr.flush()
        os._exit(1)
_rlvr_sandbox()
del _rlvr_sandbox
'''


@functools.lru_cache(maxsize=1)
def unshare_available() -> bool:
    """Whether ``unshare -rn`` (a new user + network namespace) works here; probed once."""
    path = shutil.which("unshare")
    if path is None or not sys.platform.startswith("linux"):
        return False
    try:
        out = subprocess.run([path, "-rn", sys.executable, "-I", "-S", "-c", "pass"], check=False, env={}, timeout=10,
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0


@dataclass(frozen=True, slots=True)
class SandboxResult:
    """What one sandboxed run gave. ``error`` is ``None`` on success, else an ``"error: ..."`` line."""

    output: str
    error: str | None
    exit_code: int | None
    timed_out: bool
    duration_s: float
    isolation: str

    @property
    def ok(self) -> bool:
        return self.error is None

    def content(self) -> str:
        """The tool message content: the output, then the error line, or ``"(no output)"``."""
        parts = [p for p in (self.output.rstrip("\n"), self.error) if p]
        return "\n".join(parts) if parts else "(no output)"


class PythonSandbox:
    """Runs untrusted Python in a child interpreter with limits. A best effort, not an OS sandbox.

    What each run gets:

    - a fresh interpreter ``sys.executable -I -S -B -c PRELUDE`` (isolated mode: no user site,
      no ``PYTHON*`` variables, no current directory on ``sys.path``; no ``site``), an **empty
      environment**, ``cwd`` a fresh temporary directory removed afterwards, stdin empty;
    - a **wall-clock timeout** (``timeout_s``): the whole process group is killed with SIGKILL;
    - rlimits set in the child before the user code runs: CPU time (``cpu_s``; SIGXCPU, then
      SIGKILL one second later), address space (``memory_mb``: allocations beyond it raise
      ``MemoryError``), file size (``max_file_mb``), no core dumps, 64 open files, and
      ``RLIMIT_NPROC = 0`` (no new processes or threads; the kernel ignores it for root);
    - output captured in files (bounded by the file-size limit, so a print loop cannot fill the
      parent's memory) and cut to ``max_output`` characters;
    - **network**: ``socket.socket``, ``create_connection``, ``getaddrinfo`` and friends (in both
      ``socket`` and ``_socket``) are replaced by functions raising ``PermissionError`` and
      ``ctypes`` is made unimportable, before the user code runs. This is a Python-level block:
      code that digs out the original classes (e.g. through ``__mro__``) gets around it. With
      ``network="unshare"`` (or ``"auto"``, the default, when :func:`unshare_available`) the child
      also runs under ``unshare -rn``: a new network namespace with no interfaces up, which the
      kernel enforces (loopback included);
    - **processes** (``subprocess``, ``os.system``, ``fork``, ``exec*``, ``kill``) and **writes
      outside the work directory** (``open``/``os.open`` in a writing mode, ``os.remove``,
      ``rename``, ``mkdir``...) are blocked the same Python-level way.

    The limits in the child are set by its prelude rather than in ``preexec_fn``: ``preexec_fn``
    is unsafe in a threaded parent (rollouts and the search service run in threads), and the
    prelude runs before any user code, so the effect is the same. None of this stops a determined
    attacker with a kernel or interpreter exploit; run untrusted workloads in a container or VM.
    """

    def __init__(self, *, timeout_s: float = 5.0, cpu_s: int | None = None, memory_mb: int = 512,
                 max_output: int = 2000, max_file_mb: int = 16, network: str = "auto",
                 max_code_chars: int = 100_000) -> None:
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s <= 600:
            raise ValueError(f"PythonSandbox: timeout_s must be in (0, 600], got {timeout_s!r}")
        cpu_s = max(1, math.ceil(timeout_s)) if cpu_s is None else cpu_s
        for field, value, low in (("cpu_s", cpu_s, 1), ("memory_mb", memory_mb, 64), ("max_output", max_output, 16),
                                  ("max_file_mb", max_file_mb, 1), ("max_code_chars", max_code_chars, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"PythonSandbox: {field} must be an integer >= {low}, got {value!r}")
        if network not in ("auto", "unshare", "python"):
            raise ValueError(f"PythonSandbox: network must be 'auto', 'unshare' or 'python', got {network!r}")
        if network == "unshare" and not unshare_available():
            raise RuntimeError("PythonSandbox: network='unshare' but `unshare -rn` does not work on this machine "
                               "(needs util-linux and unprivileged user namespaces); use network='auto' or 'python'")
        self.timeout_s, self.cpu_s, self.memory_mb = float(timeout_s), cpu_s, memory_mb
        self.max_output, self.max_file_mb, self.max_code_chars = max_output, max_file_mb, max_code_chars
        self.network = network

    @property
    def isolation(self) -> str:
        """``"unshare"`` when runs get their own network namespace, else ``"python"``."""
        if self.network == "python":
            return "python"
        return "unshare" if self.network == "unshare" or unshare_available() else "python"

    def __call__(self, code: str) -> str:
        return self.run(code).content()

    def run(self, code: str) -> SandboxResult:
        isolation = self.isolation
        if not isinstance(code, str):
            raise TypeError(f"PythonSandbox.run: code must be a string, got {type(code).__name__}")
        if len(code) > self.max_code_chars:
            return SandboxResult("", f"error: code longer than {self.max_code_chars} characters", None, False, 0.0,
                                 isolation)
        root = tempfile.mkdtemp(prefix="rlvr-sandbox-")
        work = os.path.join(root, "work")
        os.mkdir(work)
        prefix = [shutil.which("unshare") or "unshare", "-rn"] if isolation == "unshare" else []
        command = [*prefix, sys.executable, "-I", "-S", "-B", "-c", _PRELUDE, str(self.cpu_s),
                   str(self.memory_mb * 2**20), str(self.max_file_mb * 2**20), work]
        start = time.monotonic()
        timed_out = False
        proc: subprocess.Popen | None = None
        try:
            with open(os.path.join(root, "stdout"), "wb") as out, open(os.path.join(root, "stderr"), "wb") as err:
                proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=out, stderr=err, cwd=work, env={},
                                        start_new_session=True, close_fds=True)
                try:
                    proc.communicate(code.encode("utf-8", "replace"), timeout=self.timeout_s)
                except subprocess.TimeoutExpired:
                    timed_out = True
                    _kill_group(proc)
                    proc.communicate()
            duration = time.monotonic() - start
            stdout = _read_head(os.path.join(root, "stdout"), self.max_output)
            stderr = _read_head(os.path.join(root, "stderr"), 4000)
            error = self._error(proc.returncode, stderr, timed_out)
            return SandboxResult(stdout, error, proc.returncode, timed_out, duration, isolation)
        finally:
            if proc is not None:
                _kill_group(proc)  # anything the code left running in its group
            shutil.rmtree(root, ignore_errors=True)

    def _error(self, code: int | None, stderr: str, timed_out: bool) -> str | None:
        if timed_out:
            return f"error: TimeoutError: killed after {self.timeout_s:g}s (wall-clock limit)"
        if code == 0:
            return None
        if code is not None and code < 0:
            signum = -code
            if signum == signal.SIGXCPU:
                return f"error: TimeoutError: killed after {self.cpu_s}s of CPU time (CPU limit)"
            try:
                name = signal.Signals(signum).name
            except ValueError:
                name = str(signum)
            hint = " (CPU or memory limit)" if signum == signal.SIGKILL else ""
            return f"error: killed by signal {name}{hint}"
        lines = [line for line in stderr.splitlines() if line.strip()]
        marked = [line for line in lines if line.startswith(ERROR_PREFIX)]
        if marked:
            return marked[-1]
        tail = lines[-1][:300] if lines else ""
        return f"error: exit status {code}" + (f" ({tail})" if tail else "")


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read_head(path: str, limit: int) -> str:
    with open(path, "rb") as f:
        data = f.read(limit * 4 + 4)
        rest = os.fstat(f.fileno()).st_size - len(data)
    text = data.decode("utf-8", "replace")
    if len(text) > limit or rest > 0:
        shown = text[:limit]
        return shown + f"\n... [output truncated: {len(data) + rest} bytes in all]"
    return text


# ------------------------------------------------------------------------------------ tool calls


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One parsed call: ``name`` as written, ``args`` text, or ``error`` when it could not be read."""

    name: str
    args: str
    error: str | None = None


def parse_tool_calls(text: str, *, tag: str = "tool") -> list[ToolCall]:
    """Every tool call in ``text``, in order (both forms, see the module doc)."""
    if not isinstance(text, str):
        return []
    pattern = re.compile(rf"<({re.escape(tag)}|{_JSON_TAG})>(.*?)</\1>", re.DOTALL | re.IGNORECASE)
    calls = []
    for match in pattern.finditer(text):
        body = match.group(2)
        if match.group(1).lower() == _JSON_TAG and body.lstrip().startswith("{"):
            calls.append(_parse_json_call(body))
        else:
            calls.append(_parse_text_call(body))
    return calls


def _parse_text_call(body: str) -> ToolCall:
    name, sep, args = body.partition(":")
    name = name.strip()
    if not sep or not re.fullmatch(r"[A-Za-z_][\w.-]*", name):
        return ToolCall(name or "?", body.strip(), "error: bad tool call: expected NAME: ARGS")
    return ToolCall(name, _clean_args(args))


def _clean_args(args: str) -> str:
    first, newline, rest = args.partition("\n")
    if first.strip():
        args = first.strip() + newline + textwrap.dedent(rest)
    else:
        args = textwrap.dedent(rest)
    return args.strip("\n").rstrip()


def _parse_json_call(body: str) -> ToolCall:
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:
        return ToolCall("?", body.strip(), f"error: bad tool call: invalid JSON ({str(exc)[:100]})")
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"].strip():
        return ToolCall("?", body.strip(), 'error: bad tool call: expected {"name": ..., "arguments": ...}')
    name = data["name"].strip()
    args = data.get("arguments", data.get("parameters", ""))
    if isinstance(args, str):
        return ToolCall(name, args.strip())
    if isinstance(args, dict):
        return _json_args(name, args) if args else ToolCall(name, "")
    if isinstance(args, (int, float)) and not isinstance(args, bool):
        return ToolCall(name, str(args))
    return ToolCall(name, "", "error: bad tool call: arguments must be a string or an object")


def _json_args(name: str, args: dict[str, Any]) -> ToolCall:
    for key in (*_TOOL_ARG_KEYS.get(name, ()), "input", "query"):
        if isinstance(args.get(key), str):
            return ToolCall(name, args[key].strip())
    if len(args) == 1 and isinstance(next(iter(args.values())), (str, int, float)):
        return ToolCall(name, str(next(iter(args.values()))).strip())
    return ToolCall(name, json.dumps(args), f"error: bad tool call: cannot tell which argument of {sorted(args)} "
                                            "is the input")


# --------------------------------------------------------------------------------------- ToolEnv


class ToolEnv:
    """The model calls tools, reads the results, and answers; the final answer is paid.

    ``tools``: names of built-in tools (``"calculator"``, ``"python"``) and/or a mapping
    ``name -> fn(args: str) -> str`` (custom tools; an exception becomes an ``error:`` result).
    ``max_turns``: model turns at most. ``reward``: an inner reward function replacing exact
    match. ``answer_format``: ``"boxed"``, ``"plain"`` or ``"tags"``. ``tag``: the text-form tag.
    ``aliases``: other names for tools (default ``calc``, ``py``). ``sandbox``: the
    :class:`PythonSandbox` (or its options as a dict). ``calculator``: the :class:`Calculator`.
    ``max_calls_per_turn``: calls run per message; the rest are answered with one error.
    """

    name = NAME

    def __init__(self, tools: Sequence[str] | Mapping[str, ToolFn] = ("calculator", "python"), max_turns: int = 4,
                 reward: Callable[..., Any] | None = None, *, answer_format: str = "boxed", tag: str = "tool",
                 aliases: Mapping[str, str] | None = None, sandbox: PythonSandbox | Mapping[str, Any] | None = None,
                 calculator: Calculator | None = None, casefold: bool = True, max_calls_per_turn: int = 3,
                 max_result_chars: int = 2000) -> None:
        self.max_turns = check_max_turns(max_turns, "ToolEnv")
        if not isinstance(tag, str) or not re.fullmatch(r"[A-Za-z_][\w-]*", tag):
            raise ValueError(f"ToolEnv: tag must be a bare tag name such as 'tool', got {tag!r}")
        if isinstance(max_calls_per_turn, bool) or not isinstance(max_calls_per_turn, int) or max_calls_per_turn < 1:
            raise ValueError(f"ToolEnv: max_calls_per_turn must be an integer >= 1, got {max_calls_per_turn!r}")
        self.tag, self.max_calls_per_turn, self.max_result_chars = tag, max_calls_per_turn, max_result_chars
        self.check = AnswerCheck(answer_format, reward, casefold=casefold, who="ToolEnv")
        self.calculator = calculator or Calculator()
        self.sandbox = sandbox if isinstance(sandbox, PythonSandbox) else PythonSandbox(**dict(sandbox or {}))
        builtin: dict[str, ToolFn] = {"calculator": self.calculator, "python": self.sandbox}
        self.tools: dict[str, ToolFn] = {}
        if isinstance(tools, Mapping):
            items = list(tools.items())
        elif isinstance(tools, str):
            raise ValueError(f"ToolEnv: tools must be a list of names, got the string {tools!r}")  # noqa: TRY004
        else:
            items = [(name, None) for name in tools]
        for tool_name, fn in items:
            if fn is None:
                if tool_name not in builtin:
                    raise ValueError(f"ToolEnv: unknown tool {tool_name!r}; built-in tools: {sorted(builtin)} "
                                     "(pass a mapping name -> fn for your own)")
                fn = builtin[tool_name]
            if not callable(fn):
                raise ValueError(f"ToolEnv: tool {tool_name!r} is not callable")  # noqa: TRY004
            self.tools[tool_name] = fn
        if not self.tools:
            raise ValueError("ToolEnv: give at least one tool")
        chosen = DEFAULT_ALIASES if aliases is None else dict(aliases)
        self.aliases = {alias: target for alias, target in chosen.items() if target in self.tools}

    def resolve(self, name: str) -> str | None:
        """The tool ``name`` refers to (itself or through an alias), or ``None``."""
        if name in self.tools:
            return name
        return self.aliases.get(name)

    def format_call(self, name: str, args: str) -> str:
        """A call in this environment's text form, e.g. for an SFT warm start."""
        return f"<{self.tag}>{name}:{args}</{self.tag}>"

    def call(self, name: str, args: str) -> str:
        """Run one tool; failures come back as ``"error: Name: message"`` text."""
        target = self.resolve(name)
        if target is None:
            return f"{ERROR_PREFIX} unknown tool {name!r}; available: {', '.join(self.tools)}"
        try:
            result = self.tools[target](args)
        except Exception as exc:  # noqa: BLE001 - the model sees every failure as text
            text = str(exc)
            return f"{ERROR_PREFIX} {type(exc).__name__}" + (f": {text[:300]}" if text else "")
        if not isinstance(result, str):
            result = str(result)
        if len(result) > self.max_result_chars:
            result = result[: self.max_result_chars] + "\n... [truncated]"
        return result

    def interact(self, messages: list[dict[str, Any]], state: dict[str, Any]) -> list[dict[str, Any]]:
        if turn_of(messages, state) >= self.max_turns:
            return []
        calls = parse_tool_calls(last_assistant_text(messages, who="ToolEnv.interact"), tag=self.tag)
        out = []
        for call in calls[: self.max_calls_per_turn]:
            target = self.resolve(call.name) or call.name
            content = call.error or self.call(call.name, call.args)
            out.append({"role": "tool", "name": target, "content": content})
        if len(calls) > self.max_calls_per_turn:
            out.append({"role": "tool", "name": "?", "content": f"{ERROR_PREFIX} too many tool calls in one turn "
                                                                 f"({len(calls)}; at most {self.max_calls_per_turn} run)"})
        return out

    def reward_fn(self, messages: Sequence[Mapping[str, Any]], answer: Any) -> Score | None:
        results = [m for m in messages if isinstance(m, Mapping) and m.get("role") == "tool"]
        metrics = {"tool_calls": float(len(results)), "tool_errors": float(sum(map(is_error, results)))}
        if parse_tool_calls(last_assistant_text(messages, who="ToolEnv.reward_fn"), tag=self.tag):
            return Score({"correct": 0.0, "parsed": 0.0, **metrics}, WEIGHTS)  # ran out of turns mid-call
        components = self.check.components(messages, answer)
        if components is None:
            return None
        return Score({**components, **metrics}, WEIGHTS)

    def make_rows(self, n: int, *, seed: int, **options: Any) -> list[dict[str, Any]]:
        """Procedural multiplication rows (:func:`make_rows`)."""
        return make_rows(n, seed=seed, **options)

    def describe(self) -> dict[str, Any]:
        return {"type": f"{__name__}.ToolEnv", "tools": list(self.tools), "max_turns": self.max_turns,
                "tag": self.tag, "aliases": dict(self.aliases), "isolation": self.sandbox.isolation,
                **self.check.describe()}


def is_error(message: Mapping[str, Any]) -> bool:
    """Whether a tool message reports a failure: its last non-empty line starts with ``error:``."""
    content = message.get("content")
    lines = [line for line in content.splitlines() if line.strip()] if isinstance(content, str) else []
    return bool(lines) and lines[-1].lstrip().startswith(ERROR_PREFIX)


def terse(max_turns: int = 2, **kwargs: Any) -> ToolEnv:
    """The variant for the tiny character-level model: calculator only, ``<t>c:EXPR</t>``, plain answers."""
    kwargs.setdefault("tools", ("calculator",))
    kwargs.setdefault("tag", "t")
    kwargs.setdefault("aliases", TERSE_ALIASES)
    kwargs.setdefault("answer_format", "plain")
    return ToolEnv(max_turns=max_turns, **kwargs)


def load_environment(**kwargs: Any) -> ToolEnv:
    """The factory :func:`rlvr.envs.contract.load_environment` calls with its keyword arguments."""
    return ToolEnv(**kwargs)


# ------------------------------------------------------------------------------- procedural rows


def make_rows(n: int, *, seed: int, digits: Sequence[int] = (3, 2), op: str = "*") -> list[dict[str, Any]]:
    """``n`` rows ``{"prompt": "412*37=", "answer": "15244", "info": {...}}`` that a calculator
    call solves; a pure function of ``(seed, index, options)`` (prefix-stable).

    ``digits``: the digit count of each operand (two or more operands). ``op``: ``*``, ``+`` or ``-``.
    ``info["expression"]`` is the expression to pass to the calculator.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"tools: n must be an integer >= 0, got {n!r}")
    digits = tuple(digits)
    if len(digits) < 2 or any(isinstance(d, bool) or not isinstance(d, int) or not 1 <= d <= 6 for d in digits):
        raise ValueError(f"tools: digits must list two or more digit counts in 1..6, got {digits!r}")
    if op not in ("*", "+", "-"):
        raise ValueError(f"tools: op must be '*', '+' or '-', got {op!r}")
    rows = []
    for index in range(n):
        rng = rng_for(seed, NAME, index)
        numbers = [rng.randint(0 if d == 1 else 10 ** (d - 1), 10**d - 1) for d in digits]
        expression = op.join(map(str, numbers))
        value = Calculator().evaluate(expression)
        info = {"task": NAME, "index": index, "numbers": numbers, "op": op, "expression": expression}
        rows.append({"prompt": f"{expression}=", "answer": format_number(value), "info": info})
    return rows
