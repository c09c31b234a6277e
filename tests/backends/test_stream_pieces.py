"""A choice sampled whole, cut into per-token stream deltas (the recording proxy's ``stream=true``), on
SmolLM2's byte-level tokenizer: each token's piece is what decoding up to it adds, the pieces always
concatenate to the choice's text (also one cut short by a stop string), and the cut decodes a
bounded window per token, so a long completion costs linear, not quadratic, work."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("transformers")

from rlvr.backends.serve.choices import Choice  # noqa: E402
from rlvr.backends.serve.streaming import _pieces  # noqa: E402
from support.chatml import smollm2_tokenizer  # noqa: E402

TEXT = "Sums: 12+30=42, naïve café, 日本語テキスト, code: def f(x): return x**2\n"


@pytest.fixture(scope="module")
def tok():
    return smollm2_tokenizer()


def choice(ids: list[int], text: str) -> Choice:
    return Choice(ids=list(ids), logprobs=[-1.0] * len(ids), text=text, finish_reason="stop", stop_reason=None)


class CountingTokenizer:
    """Counts the token ids every ``decode`` is handed."""

    def __init__(self, tok):
        self.tok, self.decoded = tok, 0

    def decode(self, ids, **kwargs):
        self.decoded += len(ids)
        return self.tok.decode(ids, **kwargs)


@pytest.mark.parametrize("skip", [True, False])
def test_each_piece_is_what_decoding_up_to_its_token_adds(tok, skip):
    ids = tok.encode(TEXT * 3 + "<|im_end|>", add_special_tokens=False)
    text = tok.decode(ids, skip_special_tokens=skip)
    pieces = _pieces(tok, choice(ids, text), skip)
    assert [k for _, k in pieces] == list(range(len(ids)))
    assert "".join(p for p, _ in pieces) == text
    split_chars = 0
    for k in range(len(ids) - 1):
        upto = tok.decode(ids[:k + 1], skip_special_tokens=skip)
        if upto.endswith("\ufffd"):  # half a character: nothing goes out until it is whole
            split_chars += 1
            assert pieces[k][0] == ""
        else:
            assert "".join(p for p, _ in pieces[:k + 1]) == upto, k
    assert split_chars  # the CJK characters are two tokens each here: the case above was met


def test_random_tokens_and_a_text_cut_short_still_concatenate_exactly(tok):
    rng = random.Random(0)
    for _ in range(50):
        ids = [rng.randrange(len(tok)) for _ in range(rng.randint(1, 30))]
        full = tok.decode(ids, skip_special_tokens=True)
        for text in (full, full[:len(full) // 2]):  # a stop string ends the text before the last token
            assert "".join(p for p, _ in _pieces(tok, choice(ids, text), True)) == text


def test_a_long_completion_decodes_a_bounded_window_per_token(tok):
    ids = tok.encode(TEXT * 60, add_special_tokens=False)
    counting = CountingTokenizer(tok)
    pieces = _pieces(counting, choice(ids, tok.decode(ids)), True)
    assert "".join(p for p, _ in pieces) == tok.decode(ids)
    # Decoding every prefix would hand decode about len(ids)**2 / 2 ids (over a million here).
    assert len(ids) > 1500 and counting.decoded <= 10 * len(ids)
