"""Writes ``src/rlvr/data/confusables.py``: the look-alike table of the split's normal form.

The table is built once from Unicode's confusables data (UTS #39) as the ``confusable-homoglyphs``
package ships it (``confusables.json``, both directions of each ``source → prototype`` line), and
committed: the split must not depend on which packages a machine has, so rlvr never reads the
package at run time. Rebuild with::

    pip install --target /tmp/ch confusable-homoglyphs==3.3.1
    python tools/build_confusables.py /tmp/ch/confusable_homoglyphs/confusables.json > src/rlvr/data/confusables.py

A character enters the table when it is not ASCII, NFKC leaves it as it is, it is no format
character (those are removed) and no decimal digit (those are read as their value), and some
printable ASCII character has its prototype: it maps to that ASCII character (of its own case when
there is a choice, never a digit: a letter that looks like ``3`` stays a letter).
"""

from __future__ import annotations

import json
import string
import sys
import unicodedata
from pathlib import Path

PACKAGE = "confusable-homoglyphs 3.3.1"


def prototypes(data: dict[str, list[dict[str, str]]]) -> dict[str, str]:
    """source → prototype. A source has one line (one entry); a prototype may have many, and a
    multi-character string is always a prototype. A pair that reads both ways: the higher code point
    is the source."""
    out = {}
    for x, entries in data.items():
        if len(x) != 1 or len(entries) != 1:
            continue
        p = entries[0]["c"]
        back = data.get(p, [])
        if len(p) > 1 or len(back) > 1 or ord(x) > ord(p[0]):
            out[x] = p
    return out


def ascii_for(c: str, proto: dict[str, str], by_proto: dict[str, list[str]]) -> str | None:
    p = proto.get(c, c)
    candidates = [a for a in by_proto.get(p, []) if not a.isdigit()]
    if not candidates:
        return p if p.isascii() and p.isprintable() and not any(ch.isdigit() for ch in p) and p != c else None

    def rank(a: str) -> tuple[int, int, str]:
        same_case = (c.isupper() and a.isupper()) or (c.islower() and a.islower())
        return (0 if same_case else 1, 0 if a == p else 1, a)

    return min(candidates, key=rank)


def build(path: str) -> dict[int, str]:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    proto = prototypes(data)
    by_proto: dict[str, list[str]] = {}
    for a in string.printable:
        if a.isspace() and a != " ":
            continue
        by_proto.setdefault(proto.get(a, a), []).append(a)
    table = {}
    for c in sorted(data, key=lambda s: [ord(ch) for ch in s]):
        if len(c) != 1 or c.isascii() or unicodedata.normalize("NFKC", c) != c:
            continue
        if unicodedata.category(c) == "Cf" or unicodedata.decimal(c, None) is not None:
            continue
        target = ascii_for(c, proto, by_proto)
        if target is not None:
            table[ord(c)] = target
    return table


def module_text(table: dict[int, str]) -> str:
    items = [f"0x{cp:04X}: {json.dumps(t)}" for cp, t in sorted(table.items())]
    lines, line = [], ""
    for item in items:
        if len(line) + len(item) + 2 > 116:
            lines.append(line.rstrip())
            line = ""
        line += item + ", "
    lines.append(line.rstrip())
    body = "\n".join("    " + x for x in lines)
    return (f'"""Look-alike characters and the ASCII character each stands for in the split\'s normal form\n'
            f"(:mod:`rlvr.data.normal`): {len(table)} entries, built from Unicode's confusables data (UTS #39) as\n"
            f"{PACKAGE} ships it, by ``tools/build_confusables.py`` (which says how; do not edit by hand).\n"
            f"Committed, so the split never depends on what a machine has installed. Data only.\n"
            f'"""\n\nSKELETON: dict[int, str] = {{\n{body}\n}}\n')


if __name__ == "__main__":
    sys.stdout.write(module_text(build(sys.argv[1])))
