"""A completion request's prompt in each of OpenAI's four shapes reads as the same list of prompts
(``rlvr serve`` and ``rlvr proxy`` both read it through ``CompletionBody.prompts``)."""

from __future__ import annotations

import pytest

pytest.importorskip("pydantic")

from rlvr.backends.serve.requests import CompletionBody  # noqa: E402


@pytest.mark.parametrize(("prompt", "expected"), [
    ("2+3=", ["2+3="]),
    (["2+3=", "4+4="], ["2+3=", "4+4="]),
    ([5, 6, 7], [[5, 6, 7]]),
    ([[5, 6], [7]], [[5, 6], [7]]),
    ([], []),
])
def test_each_prompt_shape_is_a_list_of_prompts(prompt, expected):
    assert CompletionBody(prompt=prompt).prompts() == expected


def test_token_ids_are_not_read_as_texts():
    (ids,) = CompletionBody(prompt=[1, 2]).prompts()
    assert isinstance(ids, list) and all(isinstance(t, int) for t in ids)
