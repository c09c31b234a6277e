"""The in-process draw: counter-based uniforms, vLLM's processing order, inverse-CDF sampling.

Frequencies are checked with a fixed set of seeds (deterministic: no flaky test) against the
filtered distribution computed by hand, by a chi-square statistic under its 0.999 quantile."""

from __future__ import annotations

import math
import random

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch  # noqa: E402

from rlvr.backends.sample.batched import SeededDraw  # noqa: E402
from rlvr.backends.sample.noise import _mul32, row_keys, uniform, uniforms  # noqa: E402
from rlvr.backends.sample.processing import check_params, penalise, processed_logprobs  # noqa: E402
from rlvr.types import SamplingParams  # noqa: E402

LOGITS = [2.0, 1.0, 0.0, -1.0, -3.0]
CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47}  # 0.999 quantiles by degrees of freedom


def test_32_bit_products_stay_exact_and_below_2_to_the_49():
    rng = random.Random(0)
    xs = [0, 1, 0xFFFFFFFF, 0x80000000] + [rng.getrandbits(32) for _ in range(200)]
    for c in (0x85EBCA6B, 0xC2B2AE35, 0xFFFFFFFF):
        assert [_mul32(x, c) for x in xs] == [(x * c) % (1 << 32) for x in xs]
        # the largest intermediate: a 32-bit word times a 16-bit half, plus a 32-bit term
        assert 0xFFFFFFFF * 0xFFFF + (0xFFFF << 16) < 1 << 49
    tensor = torch.tensor(xs, dtype=torch.int64)
    assert _mul32(tensor, 0x85EBCA6B).tolist() == [_mul32(x, 0x85EBCA6B) for x in xs]


def test_tensor_uniforms_equal_the_python_definition_bit_for_bit():
    seeds = [0, 1, 7, -5, (1 << 63) - 1, (1 << 64) - 1, 1 << 70, 123456789012345]
    keys = row_keys(seeds, "cpu")
    for position in (0, 1, 2, 63, 1000, (1 << 32) + 3):
        got = uniforms(keys, position).tolist()
        assert got == [uniform(s, position) for s in seeds]
        assert all(0.0 <= u < 1.0 for u in got)


def test_uniforms_look_uniform_and_independent():
    keys = row_keys(range(4000), "cpu")
    draws = torch.stack([uniforms(keys, t) for t in range(5)])  # [positions, seeds]
    counts = torch.histc(draws.flatten().float(), bins=10, min=0.0, max=1.0)
    expected = draws.numel() / 10
    assert float(((counts - expected) ** 2 / expected).sum()) < 27.88  # chi-square, 9 dof, 0.999
    # neighbouring positions of one seed, and neighbouring seeds at one position, are uncorrelated
    for a, b in ((draws[0], draws[1]), (draws[2, :-1], draws[2, 1:])):
        assert abs(float(torch.corrcoef(torch.stack([a, b]))[0, 1])) < 0.06


def _draws(params: SamplingParams, logits=LOGITS, n: int = 4000, position: int = 0):
    """``n`` rows with the same logits and seeds 0..n-1: their chosen tokens and recorded log-probs."""
    drawer = SeededDraw(params, list(range(n)), 1, torch.zeros(n, 1, dtype=torch.long), torch.ones(n, 1))
    scores = torch.tensor([logits]).repeat(n, 1)
    out = drawer(torch.zeros(n, 1 + position, dtype=torch.long), scores)
    chosen = out.argmax(dim=-1)
    assert torch.equal((out == 0).sum(-1), torch.ones(n, dtype=torch.long))  # one token kept per row
    return chosen, drawer.logprobs(1)[:, 0]


def _check_frequencies(params: SamplingParams, probs: list[float]) -> None:
    chosen, logprobs = _draws(params)
    counts = torch.bincount(chosen, minlength=len(probs)).double()
    expected = torch.tensor(probs, dtype=torch.float64) * len(chosen)
    kept = expected > 0
    assert counts[~kept].sum() == 0, f"a dropped token was sampled: {counts.tolist()}"
    chi2 = float(((counts[kept] - expected[kept]) ** 2 / expected[kept]).sum())
    assert chi2 < CHI2_999[int(kept.sum()) - 1], (counts.tolist(), expected.tolist(), chi2)
    # every recorded log-prob is the chosen token's under the filtered distribution
    want = torch.tensor(probs, dtype=torch.float64).log()[chosen].float()
    assert torch.allclose(logprobs, want, atol=1e-5)


def _softmax_on(keep: list[int], temperature: float = 1.0) -> list[float]:
    weights = [math.exp(LOGITS[i] / temperature) if i in keep else 0.0 for i in range(len(LOGITS))]
    return [w / sum(weights) for w in weights]


def test_temperature_alone_samples_the_tempered_softmax():
    _check_frequencies(SamplingParams(temperature=0.7), _softmax_on([0, 1, 2, 3, 4], 0.7))


def test_top_k_samples_the_k_most_likely_renormalised():
    _check_frequencies(SamplingParams(top_k=2), _softmax_on([0, 1]))
    _check_frequencies(SamplingParams(top_k=3, temperature=1.5), _softmax_on([0, 1, 2], 1.5))
    _check_frequencies(SamplingParams(top_k=-1), _softmax_on([0, 1, 2, 3, 4]))  # vLLM's other "off"


def test_min_p_drops_tokens_below_a_fraction_of_the_most_likely_after_temperature():
    # T=1: p_i / p_max = e^(x_i - 2): 1, 0.37, 0.135, 0.050, 0.0067; min_p = 0.1 keeps three.
    _check_frequencies(SamplingParams(min_p=0.1), _softmax_on([0, 1, 2]))
    # T=2: e^((x_i - 2) / 2): 1, 0.61, 0.37, 0.22, 0.082; the same min_p keeps four.
    _check_frequencies(SamplingParams(min_p=0.1, temperature=2.0), _softmax_on([0, 1, 2, 3], 2.0))


def test_top_p_and_top_k_together_as_vllm_orders_them():
    # Probabilities 0.64, 0.24, 0.087, 0.032, 0.004: top_p = 0.8 keeps the two that reach it.
    _check_frequencies(SamplingParams(top_p=0.8), _softmax_on([0, 1]))
    # top_k = 3 first (0.665, 0.245, 0.090 renormalised), then top_p = 0.9 drops the 0.090.
    _check_frequencies(SamplingParams(top_k=3, top_p=0.9), _softmax_on([0, 1]))


def test_greedy_takes_the_argmax_and_records_its_temperature_1_log_prob():
    chosen, logprobs = _draws(SamplingParams(temperature=0.0, top_k=1), n=3)
    assert chosen.tolist() == [0, 0, 0]
    assert logprobs.tolist() == pytest.approx([math.log(_softmax_on([0, 1, 2, 3, 4])[0])] * 3, abs=1e-6)


def test_a_row_draws_the_same_whatever_shares_its_batch_and_each_position_anew():
    params = SamplingParams(temperature=1.0)
    rows = 64
    logits = torch.randn(rows, 50, generator=torch.Generator().manual_seed(0))

    def chosen(seeds, scores, position=0):
        drawer = SeededDraw(params, seeds, 1, torch.zeros(len(seeds), 1, dtype=torch.long), torch.ones(len(seeds), 1))
        return drawer(torch.zeros(len(seeds), 1 + position, dtype=torch.long), scores.clone()).argmax(-1).tolist()

    together = chosen(list(range(rows)), logits)
    assert [chosen([s], logits[s:s + 1])[0] for s in range(0, rows, 7)] == together[::7]
    assert chosen(list(range(rows)), logits, position=1) != together  # a new uniform per position


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens():
    scores = torch.tensor([[2.0, 1.0, -1.0, -0.5]])
    seen = torch.tensor([[True, False, True, False]])
    assert penalise(scores, seen, 2.0).tolist() == [[1.0, 1.0, -2.0, -0.5]]


def test_the_penalty_reaches_prompt_tokens_but_not_padding_and_then_each_sampled_token():
    params = SamplingParams(temperature=0.0, repetition_penalty=4.0)
    prompt = torch.tensor([[0, 3], [0, 0]])  # row 0: token 3 after one pad (id 0); row 1: two pads
    mask = torch.tensor([[0, 1], [0, 0]])
    drawer = SeededDraw(params, [0, 1], 2, prompt, mask)
    first = drawer(prompt, torch.tensor([[1.0, 0.5, 0.2, 3.0]] * 2))
    assert first.argmax(-1).tolist() == [0, 3]  # row 0's 3.0 became 0.75; the pad id 0 is not penalised
    second = drawer(torch.cat([prompt, first.argmax(-1, keepdim=True)], 1), torch.tensor([[1.0, 0.9, 0.2, 0.1]] * 2))
    assert second.argmax(-1).tolist() == [1, 0]  # row 0 sampled 0 (now 0.25 < 0.9); row 1 sampled 3


def test_processed_logprobs_are_vllms_order_vocabulary_wide():
    scores = torch.tensor([LOGITS])
    logp = processed_logprobs(scores.clone(), SamplingParams(top_k=3, temperature=0.5))
    kept = torch.log_softmax(torch.tensor([2.0, 1.0, 0.0]) / 0.5, -1)
    assert torch.allclose(logp[0, :3], kept) and torch.isinf(logp[0, 3:]).all()
    assert torch.allclose(processed_logprobs(scores.clone(), SamplingParams(temperature=0.0, top_k=1)),
                          torch.log_softmax(scores, -1))  # greedy: temperature 1, no truncation


@pytest.mark.parametrize(("field", "value"), [("top_k", -2), ("top_k", 1.5), ("min_p", 1.5), ("top_p", 0.0),
                                              ("repetition_penalty", 0.0), ("temperature", -1.0)])
def test_out_of_range_knobs_are_refused_by_name(field, value):
    with pytest.raises(ValueError, match=field):
        check_params(SamplingParams(**{field: value}))
