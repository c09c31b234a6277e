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
malformed call, a ``ZeroDivisionError``...), or ``"error: [sandbox] ..."`` for the Python sandbox's
own verdicts (a timeout, a CPU or memory limit, an exit status). A message without a tool call is the
final answer: ``interact`` returns ``[]``. It also returns ``[]`` once ``state["turn"]`` reaches
``max_turns``.

Reward: the final answer (the last assistant message) is checked as in
:class:`rlvr.envs.multiturn.retry.AnswerCheck` (``answer_format`` ``"boxed"``/``"plain"``/``"tags"`` with
exact match, or an ``inner`` reward); a conversation whose last assistant message is still a
tool call ran out of turns and gets ``correct = parsed = 0``. The :class:`Score` pays
``correct`` and records ``tool_calls`` (tool messages in the conversation) and ``tool_errors``
(those whose last line starts with ``error:``, see :func:`is_error`; a Python result that
prints such a line itself counts too).

Tools
-----
- :class:`~rlvr.envs.services.calculator.Calculator`: safe arithmetic (:mod:`rlvr.envs.services.calculator`).
- :class:`~rlvr.envs.services.sandbox.PythonSandbox`: runs code in a child interpreter; see its docstring
  (:mod:`rlvr.envs.services.sandbox`) for exactly what is and is not isolated.

Procedural rows (:func:`make_rows`: ``"412*37="`` → ``"15244"``) and :func:`terse` (tag ``t``,
alias ``c``, plain answers) let the CPU demo's tiny model use the calculator:
``<t>c:412*37</t>`` is 15 characters.

Standard library only.
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlvr.envs.answers import AnswerCheck, check_max_turns, turn_of
from rlvr.envs.parsing import last_assistant_text
from rlvr.envs.services.calculator import Calculator, format_number
from rlvr.envs.services.sandbox import ERROR_PREFIX, PythonSandbox, SandboxResult, bwrap_available
from rlvr.errors import CalculatorError
from rlvr.reward import Score
from rlvr.seeding import rng_for

__all__ = [
    "NAME", "Calculator", "CalculatorError", "PythonSandbox", "SandboxResult", "ToolCall", "ToolEnv",
    "bwrap_available", "format_number", "is_error", "load_environment", "make_rows", "parse_tool_calls", "terse"
]

NAME = "tools"
WEIGHTS = {"correct": 1.0}
DEFAULT_ALIASES = {"calc": "calculator", "py": "python"}
TERSE_ALIASES = {"c": "calculator", "p": "python"}
_JSON_TAG = "tool_call"
_TOOL_ARG_KEYS = {"calculator": ("expression", "expr"), "python": ("code",)}

ToolFn = Callable[[str], str]


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
        self.tools: dict[str, ToolFn] = {}
        items: list[tuple[str, ToolFn | None]]
        if isinstance(tools, Mapping):
            items = list(tools.items())
        elif isinstance(tools, str):
            raise ValueError(f"ToolEnv: tools must be a list of names, got the string {tools!r}")  # noqa: TRY004
        else:
            items = [(name, None) for name in tools]
        # The sandbox is built only when the python tool is asked for: without bubblewrap it refuses.
        wants_python = any(fn is None and tool_name == "python" for tool_name, fn in items)
        self.sandbox: PythonSandbox | None = sandbox if isinstance(sandbox, PythonSandbox) else \
            PythonSandbox(**dict(sandbox or {})) if wants_python else None
        builtin: dict[str, ToolFn] = {"calculator": self.calculator}
        if self.sandbox is not None:
            builtin["python"] = self.sandbox
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
            note = (f"{ERROR_PREFIX} too many tool calls in one turn "
                    f"({len(calls)}; at most {self.max_calls_per_turn} run)")
            out.append({"role": "tool", "name": "?", "content": note})
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
        isolation = self.sandbox.isolation if self.sandbox is not None else None
        return {"type": f"{__name__}.ToolEnv", "tools": list(self.tools), "max_turns": self.max_turns,
                "tag": self.tag, "aliases": dict(self.aliases), "isolation": isolation, **self.check.describe()}


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
    """The factory :func:`rlvr.envs.loading.load_environment` calls with its keyword arguments."""
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
