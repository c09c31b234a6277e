"""The coding task's edit format, and what an edit may touch.

An agent's reply is one edit per line, nothing else (blank lines aside)::

    PATH:LINE:TEXT          replace line LINE (from 1) of PATH with TEXT
                            (LINE one past the end appends a line)

e.g. ``calc.py:2:    return a + b``. TEXT keeps its leading whitespace (the indentation) and
loses its trailing whitespace. Short on purpose: the demo's character-level model writes it.

An edit is **refused** (the reply scores 0 and nothing runs) when:

- a line is not of that form, or there are more than ``max_edits`` edits;
- PATH is not one of the repository's source files, exactly as listed: no test file (the tests
  decide the reward, so they are never the agent's to change), no new file, no absolute path, no
  ``..`` or any other spelling of a path (traversal is never resolved, only compared);
- LINE is outside ``1..len+1``, or two edits name the same line;
- TEXT uses what the tests share an interpreter with: a name starting with ``_``, attribute access
  (``x.y``), an f-string, a keyword outside :data:`KEYWORDS` (``import``, ``raise``, ``while``,
  ``lambda``, ``global``, ``try`` ...) or a builtin outside :data:`BUILTINS` (``open``, ``exec``,
  ``print``, ``getattr``, ``exit`` ...); or TEXT does not tokenize.

Why the guard: the edited module is imported by the test runner, in the same interpreter
(:mod:`rlvr.envs.coding.runner`). The sandbox keeps any code from the host; the guard keeps an edit
from reaching the runner itself (ending the process early, printing a verdict, reading its
frames), so that the tests' report is the tests'. Standard library only.
"""

from __future__ import annotations

import builtins
import io
import keyword
import re
import tokenize
from dataclasses import dataclass

from rlvr.errors import EditRefused

KEYWORDS = frozenset({"return", "if", "else", "and", "or", "not", "in", "is", "None", "True", "False", "pass",
                      "def", "for"})
BUILTINS = frozenset({"abs", "min", "max", "len", "sum", "int", "bool", "str", "range", "sorted", "round",
                      "divmod", "pow", "any", "all", "list", "tuple", "reversed"})
_FORBIDDEN_BUILTINS = frozenset(n for n in dir(builtins) if n not in BUILTINS and not keyword.iskeyword(n))
_EDIT = re.compile(r"([^:\n]*):([0-9]{1,4}):(.*)")
MAX_TEXT = 200



@dataclass(frozen=True, slots=True)
class Edit:
    path: str
    line: int
    text: str

    def render(self) -> str:
        return f"{self.path}:{self.line}:{self.text}"


def parse_edits(reply: str, *, max_edits: int = 3) -> list[Edit]:
    """The edits a reply holds; :class:`EditRefused` naming the first line that is not one."""
    if not isinstance(reply, str):
        raise EditRefused(f"the reply is {type(reply).__name__}, not text")
    edits = []
    for number, raw in enumerate(reply.splitlines(), 1):
        if not raw.strip():
            continue
        match = _EDIT.fullmatch(raw.rstrip())
        if match is None:
            raise EditRefused(f"reply line {number} is not PATH:LINE:TEXT: {raw[:80]!r}")
        edits.append(Edit(match.group(1), int(match.group(2)), match.group(3)))
    if not edits:
        raise EditRefused("the reply holds no edit (PATH:LINE:TEXT)")
    if len(edits) > max_edits:
        raise EditRefused(f"{len(edits)} edits; at most {max_edits}")
    return edits


def check_text(text: str) -> None:
    """Refuses TEXT that could reach the test runner (see the module doc)."""
    if len(text) > MAX_TEXT:
        raise EditRefused(f"edit text longer than {MAX_TEXT} characters")
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text.strip() + "\n").readline))
    except (tokenize.TokenError, SyntaxError, IndentationError) as exc:
        raise EditRefused(f"edit text does not tokenize: {exc}") from None
    for token in tokens:
        if token.type == tokenize.NAME:
            name = token.string
            if name.startswith("_"):
                raise EditRefused(f"edit text uses {name!r}: no name may start with '_'")
            if keyword.iskeyword(name) and name not in KEYWORDS:
                raise EditRefused(f"edit text uses the keyword {name!r}; allowed: {', '.join(sorted(KEYWORDS))}")
            if name in _FORBIDDEN_BUILTINS:
                raise EditRefused(f"edit text uses the builtin {name!r}; allowed: {', '.join(sorted(BUILTINS))}")
        elif token.type == tokenize.OP and token.string == ".":  # numbers are NUMBER tokens: this is x.y
            raise EditRefused("edit text uses attribute access ('.')")
        elif token.type == tokenize.STRING and "f" in token.string.split("'")[0].split('"')[0].lower():
            raise EditRefused("edit text uses an f-string")
        elif token.type not in (tokenize.NAME, tokenize.OP, tokenize.NUMBER, tokenize.STRING, tokenize.NEWLINE,
                                tokenize.NL, tokenize.ENDMARKER, tokenize.COMMENT, tokenize.INDENT,
                                tokenize.DEDENT):
            raise EditRefused(f"edit text holds a {tokenize.tok_name[token.type]} token")


def apply_edits(files: dict[str, str], sources: list[str] | tuple[str, ...], edits: list[Edit]) -> dict[str, str]:
    """``files`` with ``edits`` applied, a new mapping (``files`` is left as it is); :class:`EditRefused`
    when an edit names a path outside ``sources``, a line out of range, a line twice, or guarded text."""
    out = dict(files)
    seen: set[tuple[str, int]] = set()
    for edit in edits:
        if edit.path not in sources:
            raise EditRefused(f"{edit.path!r} is not a source file of the repository "
                              f"({', '.join(sorted(sources))}); tests and other paths are not editable")
        if (edit.path, edit.line) in seen:
            raise EditRefused(f"two edits of {edit.path}:{edit.line}")
        seen.add((edit.path, edit.line))
        check_text(edit.text)
        lines = out[edit.path].splitlines()
        if not 1 <= edit.line <= len(lines) + 1:
            raise EditRefused(f"{edit.path} has {len(lines)} lines; line {edit.line} is out of range")
        if edit.line == len(lines) + 1:
            lines.append(edit.text.rstrip())
        else:
            lines[edit.line - 1] = edit.text.rstrip()
        out[edit.path] = "\n".join(lines) + "\n"
    return out
