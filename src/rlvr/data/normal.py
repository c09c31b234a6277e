"""The normal form of a row's prompt: what decides its side of the held-out split, and what counts as
"the same question" when a model's training rows are compared with a run's held-out rows.

Two rows a model cannot tell apart as questions must land on the same side, or a copy of a held-out
question is trained on. The split keys on the **prompt only**: every row with the same normal prompt
is one question, whatever its answer (``25``, ``\\boxed{25}``, ``#### 25`` and ``["25"]`` alike; rows
of one prompt with different answers are reported by the split, never split). The normal prompt is
the JSON text of ``["tokens", ids]`` for a token-in row (``info.prompt_ids``: the tokens are what the
model sees) and otherwise of ``["messages", [[role, text], ...]]`` over the row's messages, **system
messages left out** (an added system prompt does not make another question; a plain-text ``prompt``
is the single user message it becomes). Each message's text goes through these rules, in order:

1. HTML entities unescaped: ``"2 &#43; 3"`` reads ``"2 + 3"``.
2. Unicode NFKC: ``"Ｆｕｌｌ"`` reads ``"Full"``, ``"x²"`` reads ``"x2"``.
3. Format characters (category Cf) removed: zero-width space, soft hyphen, word joiner, BOM
   (``"tw\\u200bo"`` reads ``"two"``).
4. Decimal digits of every script read as ASCII digits: ``"١٢"`` (Arabic-Indic) reads ``"12"``.
5. Look-alikes read as the ASCII character they imitate (:mod:`rlvr.data.confusables`, from Unicode's
   confusables data): Cyrillic ``"а"`` reads ``"a"``, ``"’"`` reads ``"'"``, U+2212 reads ``"-"``.
   A letter is never read as a digit.
6. Case-folded: ``"PARIS"`` reads ``"paris"``.
7. Markdown emphasis dropped: ``"**12**"``, ``"*12*"``, ``"__12__"``, ``"`12`"`` read ``"12"``
   (``"2*3*4"`` is arithmetic, not emphasis, and stays).
8. English number words read as numbers: ``"twelve"`` reads ``"12"``, ``"twenty-five"`` ``"25"``,
   ``"one hundred and five"`` ``"105"``.
9. Split into tokens (a run of letters, a number, one other character), whitespace dropped:
   ``"2+3"`` and ``"2 + 3"`` are one text, ``"12 3"`` and ``"123"`` two.
10. Numbers canonical: grouping commas, trailing fraction zeros and leading zeros go:
    ``"1,120"`` reads ``"1120"``, ``"12.0"`` ``"12"``, ``"0.50"`` ``"0.5"``.
11. Trailing sentence punctuation dropped: ``"What is 12 plus 13?"`` reads as ``"What is 12 plus 13"``.

Digits are never fuzzed away: ``"What is 12 plus 13?"`` and ``"What is 12 plus 14?"`` stay two
questions. :func:`split_key` is the sha256 of the normal prompt: a stable content hash (never Python's
``hash()``), independent of corpus order, row ids, the answer and ``info`` (but ``info.prompt_ids``).
:func:`prompt_shape` also gives the tokens, sentence segments and numbers that the near-duplicate
check (:mod:`rlvr.data.twins`) works on. Answers keep their own normal form (:func:`normal_answer`),
used to find one prompt's conflicting answers. Standard library only.
"""

from __future__ import annotations

import html
import json
import math
import re
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import MAX_EMAX, MIN_EMIN, Context, Decimal, InvalidOperation
from typing import Any

from rlvr.data.confusables import SKELETON
from rlvr.seeding import stable_hash
from rlvr.types import Task

# How many hex digits of a split key a lineage file keeps (64 bits: a chance collision among a
# million rows is about 3e-8).
SHORT_KEY = 16

_ENCODER = json.JSONEncoder(sort_keys=True, ensure_ascii=False)  # one instance: json.dumps builds one per call
_EXACT = Context(prec=100, Emax=MAX_EMAX, Emin=MIN_EMIN)
_NUMBER = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?(?:[eE][+-]?\d+)?")
_DIGIT = re.compile(r"\d")

# Paired delimiters around non-space text; a single one must not touch a word character outside it
# (so "2*3*4" and snake_case stay).
_EMPHASIS = re.compile(r"(\*\*|__|~~)(?=\S)(.+?)(?<=\S)\1|(?<![\w*`])([*_`])(?=[^\s*_`])(.+?)(?<=[^\s*_`])\3(?![\w*`])")
_TOKEN = re.compile(r"\d+(?:[.,]\d+)*|[^\W\d_]+|\n|[^\w\s]|_")
_GROUPED = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_DECIMAL = re.compile(r"\d+(?:\.\d+)?")
_SEPARATED = re.compile(r"([.,])")
# Sentence punctuation: dropped at the end of a message; with ",", "=" and line breaks, where segments end.
TRAILING = frozenset(".?!;:\n")
BOUNDARY = frozenset(".?!;:,=\n")

_UNITS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
          "sixteen seventeen eighteen nineteen").split()
_TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()
_SCALES = {"thousand": 10**3, "million": 10**6, "billion": 10**9}
_WORD_VALUE = {**{w: i for i, w in enumerate(_UNITS)}, **{w: 10 * (i + 2) for i, w in enumerate(_TENS)},
               "hundred": 100, **_SCALES}
_WORD = "|".join(sorted(_WORD_VALUE, key=len, reverse=True))
_NUMBER_WORDS = re.compile(rf"\b(?:{_WORD})(?:(?:[\s-]+|\s+and\s+)(?:{_WORD}))*\b")


class _Fold(dict[int, Any]):
    """str.translate table, filled on first sight of each character: format characters removed,
    decimal digits of any script as ASCII, look-alikes as their ASCII character."""

    def __missing__(self, cp: int) -> Any:
        ch = chr(cp)
        if unicodedata.category(ch) == "Cf":
            out: Any = None
        elif (d := unicodedata.decimal(ch, None)) is not None:
            out = str(d)
        else:
            out = SKELETON.get(cp, cp)
        self[cp] = out
        return out


_FOLD = _Fold()


def _words_value(words: list[str]) -> int | None:
    """The value of number words read as one number (``["twenty", "five"]`` is 25); ``None`` when they
    are not one (``["one", "two"]``)."""
    total, current, last = 0, 0, None  # last: "unit" | "teen" | "ten" | "hundred" | "scale"
    for w in words:
        v = _WORD_VALUE[w]
        if w in _SCALES:
            if current == 0 and last is None or last == "scale":
                return None
            total, current, last = total + max(current, 1) * v, 0, "scale"
        elif w == "hundred":
            if last in ("hundred", "ten") or current >= 100:
                return None
            current, last = max(current, 1) * 100, "hundred"
        elif v >= 20:
            if last in ("ten", "teen", "unit") or current % 100:
                return None
            current, last = current + v, "ten"
        else:
            if last in ("unit", "teen") or (last == "ten" and v >= 10):
                return None
            current, last = current + v, "teen" if v >= 10 else "unit"
    return total + current


def _number_words(match: re.Match[str]) -> str:
    words = [w for w in re.split(r"[\s-]+", match.group(0)) if w and w != "and"]
    value = _words_value(words)
    if value is not None:
        return str(value)
    return " ".join(str(_WORD_VALUE[w]) if w in _WORD_VALUE else w for w in re.split(r"[\s-]+", match.group(0)))


def _canonical_number(token: str) -> list[str]:
    if token.isdigit():
        return [token.lstrip("0") or "0"]
    if _GROUPED.fullmatch(token):
        token = token.replace(",", "")
    if _DECIMAL.fullmatch(token):
        whole, _, frac = token.partition(".")
        frac = frac.rstrip("0")
        return [(whole.lstrip("0") or "0") + ("." + frac if frac else "")]
    # Not one number ("1.2.3", "1,2"): its numbers and separators, each as a token.
    return [p if p in ".," else (p.lstrip("0") or "0") for p in _SEPARATED.split(token) if p]


def _folded(text: str) -> str:
    if "&" in text:
        text = html.unescape(text)
    if text.isascii():
        return text.lower()
    text = unicodedata.normalize("NFKC", text).translate(_FOLD).casefold()
    return text if text.isascii() else text.translate(_FOLD).lower()


def prompt_tokens(text: str) -> list[str]:
    """A message's text by rules 1-11 of the module doc, as tokens; ``"\\n"`` marks a line break (a
    segment boundary that :func:`normal_text_of` leaves out)."""
    text = _folded(text)
    if "*" in text or "_" in text or "~" in text or "`" in text:
        for _ in range(3):  # nested emphasis ("***12***") unwraps one pair a pass
            unwrapped = _EMPHASIS.sub(lambda m: m.group(2) if m.group(2) is not None else m.group(4), text)
            if unwrapped == text:
                break
            text = unwrapped
    text = _NUMBER_WORDS.sub(_number_words, text)
    tokens: list[str] = []
    for tok in _TOKEN.findall(text):
        if tok[0].isdigit():
            tokens.extend(_canonical_number(tok))
        elif tok != "\n" or (tokens and tokens[-1] != "\n"):
            tokens.append(tok)
    while tokens and tokens[-1] in TRAILING:
        tokens.pop()
    if tokens and tokens[0] == "\n":
        del tokens[0]
    return tokens


def normal_text_of(tokens: Iterable[str]) -> str:
    """The tokens as one text: single spaces, no line breaks."""
    return " ".join(t for t in tokens if t != "\n")


@dataclass(frozen=True, slots=True)
class Shape:
    """A prompt as the split sees it: its ``key`` (:func:`split_key`), its ``tokens`` (all messages
    but system ones, in order), its ``segments`` (the token runs between sentence punctuation, "=", line
    and message breaks) and its ``numbers`` (the number tokens, in order). A token-in row has only
    its key: its near-duplicates are not looked for."""

    key: str
    tokens: tuple[str, ...] = ()
    segments: tuple[str, ...] = ()
    numbers: tuple[str, ...] = ()


def _message_tokens(task: Task) -> list[tuple[str, list[str]]]:
    return [(m["role"], prompt_tokens(str(m.get("content", "")))) for m in task.messages if m.get("role") != "system"]


def _token_ids(task: Task) -> list[int] | None:
    ids = task.info.get("prompt_ids") if isinstance(task.info, Mapping) else None
    return [int(t) for t in ids] if ids else None


def prompt_shape(task: Task) -> Shape:
    """The prompt's :class:`Shape` (see the module doc)."""
    ids = _token_ids(task)
    if ids:
        return Shape(stable_hash(_ENCODER.encode(["tokens", ids])))
    messages = _message_tokens(task)
    key = stable_hash(_ENCODER.encode(["messages", [[role, normal_text_of(toks)] for role, toks in messages]]))
    tokens: list[str] = []
    segments: list[str] = []
    for _, toks in messages:
        run: list[str] = []
        for tok in toks:
            if tok in BOUNDARY:
                if run:
                    segments.append(" ".join(run))
                    run = []
            else:
                run.append(tok)
        if run:
            segments.append(" ".join(run))
        tokens.extend(t for t in toks if t != "\n")
    return Shape(key, tuple(tokens), tuple(segments), tuple(t for t in tokens if t[0].isdigit()))


def normal_form(task: Task) -> str:
    """The row's normal prompt as JSON text (see the module doc)."""
    ids = _token_ids(task)
    if ids:
        return _ENCODER.encode(["tokens", ids])
    return _ENCODER.encode(["messages", [[role, normal_text_of(toks)] for role, toks in _message_tokens(task)]])


def split_key(task: Task) -> str:
    """sha256 of :func:`normal_form`: rows of one question share it, whatever their answers."""
    return stable_hash(normal_form(task))


def short_keys(tasks: Iterable[Task]) -> list[str]:
    """The sorted, distinct :data:`SHORT_KEY`-digit split keys of ``tasks`` (what lineage files keep)."""
    return sorted({split_key(t)[:SHORT_KEY] for t in tasks})


# ---- answers ----------------------------------------------------------------------------------


def normal_text(text: str) -> str:
    """NFKC, case-folded, every whitespace character removed (the answer's text rule)."""
    if text.isascii():  # NFKC leaves ASCII as it is, and casefold is lower there
        return "".join(text.lower().split())
    return "".join(unicodedata.normalize("NFKC", text).casefold().split())


def _number(text: str) -> str | None:
    """The plain decimal of ``text`` when it reads as a finite number, else ``None``."""
    compact = "".join(text.split())
    if compact.isascii() and compact.isdigit():  # the common case, exactly as the general one reads it
        return compact.lstrip("0") or "0"
    if not compact or not _NUMBER.fullmatch(compact) or not _DIGIT.search(compact):
        return None
    try:
        return _plain(Decimal(compact.replace(",", "")))
    except InvalidOperation:
        return None


def _plain(value: Decimal) -> str:
    # Exact: precision enough for every digit given, no exponent bound (a long number never rounds).
    digits = len(value.as_tuple().digits)
    context = _EXACT if digits <= _EXACT.prec else Context(prec=digits, Emax=MAX_EMAX, Emin=MIN_EMIN)
    value = context.normalize(value)
    if value.is_zero():
        return "0"
    # Plain digits up to a sane length; beyond, the (equally canonical) scientific form.
    return format(value, "f") if abs(value.adjusted()) <= 60 else str(value)


def normal_answer(answer: Any) -> Any:
    """The answer's normal form: a number, or a string that reads as a decimal number (optional sign,
    ``1,234`` grouping, fraction, exponent), becomes the shortest plain decimal of its value (``25``,
    ``"25"``, ``25.0`` and ``" 25 "`` are all ``"25"``); other strings are :func:`normal_text`;
    ``true`` / ``false`` / ``null`` stay themselves; lists and mappings element by element."""
    if answer is None or isinstance(answer, bool):
        return answer
    if isinstance(answer, int):
        return str(answer)  # as a digit string reads (leading zeros dropped, "-0" is "0")
    if isinstance(answer, float):
        return _plain(Decimal(repr(answer))) if math.isfinite(answer) else repr(answer)
    if isinstance(answer, str):
        number = _number(answer)
        return number if number is not None else normal_text(answer)
    if isinstance(answer, Mapping):
        return {str(k): normal_answer(v) for k, v in sorted(answer.items(), key=lambda kv: str(kv[0]))}
    if isinstance(answer, (list, tuple)):
        return [normal_answer(v) for v in answer]
    return repr(answer)


def answer_text(task: Task) -> str:
    """The row's normal answer as JSON text: two rows of one prompt conflict when theirs differ."""
    return _ENCODER.encode(normal_answer(task.answer))
