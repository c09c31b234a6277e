"""Kinds of near-duplicate pairs a merged corpus is full of, over "What is 12 plus 13?"-shaped rows: each
maps a pair index to ``(row, twin)``, the pairs of one kind all distinct questions. ``KINDS`` are those
the normal form closes; ``HARD``, those closed by the near-duplicate clusters; ``long_problem`` a
word problem for the MinHash check."""
from __future__ import annotations

import random

AR = str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")
FW = str.maketrans("0123456789", "０１２３４５６７８９")
WORDS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
         "seventeen eighteen nineteen").split()
TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()


def words(n: int) -> str:
    if n < 20:
        return WORDS[n]
    if n < 100:
        return TENS[n // 10 - 2] + ("" if n % 10 == 0 else "-" + WORDS[n % 10])
    return words(n // 100) + " hundred" + ("" if n % 100 == 0 else " and " + words(n % 100))


def nums(i: int) -> tuple[int, int]:
    return 10 + i, 13 + 3 * i


def q(i: int, a=None, b=None, end: str = "?") -> str:
    x, y = nums(i)
    return f"What is {x if a is None else a} plus {y if b is None else b}{end}"


def row(prompt: str, answer="25", **kw):
    return {"prompt": prompt, "answer": answer, **kw}


def same_prompt(answer):
    return lambda i: (row(q(i), str(sum(nums(i)))), row(q(i), answer(sum(nums(i)))))


KINDS = {
    "zero_width_space": lambda i: (row(q(i)), row(q(i).replace("What", "Wh\u200bat"))),
    "soft_hyphen": lambda i: (row(q(i)), row(q(i).replace("plus", "pl\u00adus"))),
    "word_joiner": lambda i: (row(q(i)), row(q(i).replace(" is", "\u2060 is"))),
    "bom": lambda i: (row(q(i)), row("\ufeff" + q(i))),
    "cyrillic_a": lambda i: (row(q(i)), row(q(i).replace("What", "Wh\u0430t"))),
    "curly_apostrophe": lambda i: (row(q(i).replace("What is", "What's")), row(q(i).replace("What is", "What\u2019s"))),
    "minus_sign": lambda i: (row(q(i, b=f"-{nums(i)[1]}")), row(q(i, b=f"\u2212{nums(i)[1]}"))),
    "html_entity": lambda i: (row(q(i).replace("plus", "+")), row(q(i).replace("plus", "&#43;"))),
    "thousands_comma": lambda i: (row(q(i, a=1000 + i)), row(q(i, a=f"1,{i:03d}"))),
    "trailing_zero": lambda i: (row(q(i)), row(q(i, a=f"{nums(i)[0]}.0"))),
    "arabic_indic_digits": lambda i: (row(q(i)), row(q(i).translate(AR))),
    "dropped_question_mark": lambda i: (row(q(i)), row(q(i, end=""))),
    "markdown_bold": lambda i: (row(q(i)), row(q(i, a=f"**{nums(i)[0]}**"))),
    "answer_period": same_prompt(lambda s: f"{s}."),
    "answer_boxed": same_prompt(lambda s: f"\\boxed{{{s}}}"),
    "answer_dollar": same_prompt(lambda s: f"${s}"),
    "answer_fraction": same_prompt(lambda s: f"{s}/1"),
    "answer_list": same_prompt(lambda s: [str(s)]),
    "answer_equation": same_prompt(lambda s: f"x = {s}"),
    "answer_gloss": same_prompt(lambda s: f"{s} (twenty-something)"),
    # more of our own
    "answer_gsm8k": same_prompt(lambda s: f"#### {s}"),
    "no_break_space": lambda i: (row(q(i)), row(q(i).replace(" plus ", "\u00a0plus\u00a0"))),
    "fullwidth_digits": lambda i: (row(q(i)), row(q(i).translate(FW))),
    "greek_omicron": lambda i: (row(q(i).replace("is", "is the total of")),
                                row(q(i).replace("is", "is the t\u03bftal \u03bff"))),
    "italic_and_code": lambda i: (row(q(i)), row(q(i, a=f"*{nums(i)[0]}*", b=f"`{nums(i)[1]}`"))),
    "decimal_zeros": lambda i: (row(q(i, a=f"{i}.5")), row(q(i, a=f"{i}.50"))),
    "system_prompt_and_case": lambda i: (row(q(i)), {"messages": [{"role": "system", "content": "Be brief."},
                                                                   {"role": "user", "content": q(i).upper()}],
                                                      "answer": "25"}),
}

HARD = {
    "number_words": lambda i: (row(q(i)), row(q(i, a=words(nums(i)[0]), b=words(nums(i)[1])))),
    "instruction_suffix": lambda i: (row(q(i)), row(q(i) + " Answer with a number only.")),
    "few_shot_prefix": lambda i: (row(q(i)), row(f"Q: {q(i + 1000)}\nA: {sum(nums(i + 1000))}\n\n"
                                                f"Q: {q(i + 2000)}\nA: {sum(nums(i + 2000))}\n\nQ: {q(i)}\nA:")),
}


NAMES = ["Natalia", "Weng", "Betty", "Julie", "James", "Mark", "Albert", "Ken", "Alexis", "Tina"]


def long_problem(i: int, edits: int = 0, a=None) -> str:
    """A word problem (its numbers from ``i``); ``edits`` words changed (one or two) as a re-scraped copy has."""
    x, y = nums(i)
    name = NAMES[i % len(NAMES)]
    text = (f"{name} sold clips to {x if a is None else a} of her friends in April, and then she sold {y} more "
            f"clips in May than in April. How many clips did {name} sell altogether in April and May?")
    if edits >= 1:
        text = text.replace("altogether", "in total")
    if edits >= 2:
        text = text.replace("friends", "freinds")
    return text

_WORDS = ("apple basket river garden teacher market window bottle candle forest ribbon pencil blanket ladder "
          "orchard lantern pebble saddle violin harbor meadow kettle compass feather marble quilt tractor "
          "bakery glacier canyon rocket puzzle").split()
# A vocabulary as large as a real corpus's: made-up words of three syllables.
_SYLLABLES = "ka lo mi ne ru sa ti vo be da fe gu ho ji".split()
_MADE_UP = sorted({a + b + c for a in _SYLLABLES for b in _SYLLABLES for c in _SYLLABLES})
_DOING = "bought sold packed painted found carried stacked counted mended sorted".split()


def unique_problem(i: int, edits: int = 0) -> str:
    """A word problem of its own words (as a real corpus's are), numbers from ``i``; ``edits`` words
    swapped for others, as a re-scraped or lightly edited copy has."""
    x, y = nums(i)
    r = random.Random(i)
    w = r.sample(_WORDS, 3) + r.sample(_MADE_UP, 3)
    d = r.sample(_DOING, 3)
    words = (f"{NAMES[i % len(NAMES)]} {d[0]} {x} {w[0]}s at the {w[1]} and {d[1]} {y} {w[2]}s near the {w[3]}, "
             f"then {d[2]} every {w[4]} into a {w[5]}. How many {w[0]}s and {w[2]}s are there in all?").split()
    for e in range(edits):
        spot = r.choice([k for k, t in enumerate(words) if t.isalpha() and t.islower() and len(t) > 3])
        words[spot] = r.choice(["thing", "item", "piece", "object", "unit"]) + "s" * e
    return " ".join(words)
