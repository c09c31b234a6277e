"""The tiny local model, model loading, prompt rendering, token log-probs and the SFT warm start."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from rlvr.backends.model.io import (  # noqa: E402
    load_model,
    load_tokenizer,
    render_prompt_ids,
    token_logprobs,
)
from rlvr.backends.model.tiny import MARKER_FILE, build_tiny_model  # noqa: E402
from rlvr.backends.train.sft import encode_example, greedy_accuracy, sft_warm_start  # noqa: E402
from rlvr.envs.tasks.arithmetic import make_rows  # noqa: E402

pytestmark = pytest.mark.train


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="module")
def tokenizer(tiny_dir):
    return load_tokenizer(str(tiny_dir))


def test_folder_round_trips_through_auto_classes(tiny_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    n_params = sum(p.numel() for p in model.parameters())
    assert 1_000_000 <= n_params <= 5_000_000
    assert model.config.vocab_size == len(tokenizer)
    assert tokenizer.pad_token_id is not None and tokenizer.eos_token_id is not None
    marker = json.loads((tiny_dir / MARKER_FILE).read_text())
    assert marker["seed"] == 0 and marker["arch"] == "llama" and marker["n_params"] == n_params


def test_weights_are_deterministic_from_seed_and_leave_global_rng_alone(tmp_path):
    def weights(path):
        return AutoModelForCausalLM.from_pretrained(path).model.embed_tokens.weight

    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    a = build_tiny_model(tmp_path / "a", hidden=64, layers=1, heads=2, seed=1)
    assert torch.equal(torch.rand(3), expected)
    b = build_tiny_model(tmp_path / "b", hidden=64, layers=1, heads=2, seed=1)
    c = build_tiny_model(tmp_path / "c", hidden=64, layers=1, heads=2, seed=2)
    assert torch.equal(weights(a), weights(b))
    assert not torch.equal(weights(a), weights(c))


def test_qwen2_arch_builds_and_loads(tmp_path):
    path = build_tiny_model(tmp_path / "q", hidden=64, layers=1, heads=2, arch="qwen2")
    assert type(load_model(str(path))).__name__ == "Qwen2ForCausalLM"
    with pytest.raises(ValueError, match="arch"):
        build_tiny_model(tmp_path / "x", arch="gpt2")


def test_chat_template_renders_every_role_and_the_generation_prompt(tokenizer):
    messages = [
        {"role": "system", "content": "Add."},
        {"role": "user", "content": "37+45="},
        {"role": "assistant", "content": "82"},
        {"role": "tool", "content": "ok"},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<bos><|system|>Add.<eos><|user|>37+45=<eos><|assistant|>82<eos><|tool|>ok<eos><|assistant|>"
    )
    without = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert without == text.removesuffix("<|assistant|>")


def test_prompt_ids_are_short_and_role_markers_are_single_tokens(tokenizer):
    ids = render_prompt_ids(tokenizer, [{"role": "user", "content": "37+45="}])
    tokens = tokenizer.convert_ids_to_tokens(ids)
    assert tokens == ["<bos>", "<|user|>", "3", "7", "+", "4", "5", "=", "<eos>", "<|assistant|>"]
    # The prompt plus the reply and eos is exactly the rendering of the longer conversation.
    reply = tokenizer("82", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    longer = [{"role": "user", "content": "37+45="}, {"role": "assistant", "content": "82"}]
    text = tokenizer.apply_chat_template(longer, tokenize=False)
    assert tokenizer(text, add_special_tokens=False)["input_ids"] == ids + reply


def test_tokenizer_round_trips_task_text(tokenizer):
    texts = [row["prompt"] + row["answer"] for row in make_rows(20, seed=0, ops=("+", "-", "*"))]
    texts += ["Hello, World! (x_1 >= 2.5) & y\n\tz", "  leading and trailing  "]
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert len(ids) == len(text)
        assert tokenizer.decode(ids) == text


def test_render_prompt_ids_without_chat_template_concatenates_contents(tiny_dir):
    tokenizer = load_tokenizer(str(tiny_dir))
    tokenizer.chat_template = None
    messages = [{"role": "system", "content": "Add "}, {"role": "user", "content": "1+2="}]
    ids = render_prompt_ids(tokenizer, messages)
    assert tokenizer.decode(ids) == "Add 1+2="


def test_load_tokenizer_sets_a_missing_pad_token(tiny_dir, tmp_path):
    raw = AutoTokenizer.from_pretrained(tiny_dir)
    raw.pad_token = None
    raw.save_pretrained(tmp_path)
    assert AutoTokenizer.from_pretrained(tmp_path).pad_token is None
    assert load_tokenizer(str(tmp_path)).pad_token == raw.eos_token


def test_token_logprobs_matches_manual_computation_on_a_ragged_batch(tiny_dir, tokenizer):
    model = load_model(str(tiny_dir))
    rows = [[1, 5, 11, 15, 80, 12], [1, 5, 19, 13]]
    ids = torch.tensor([rows[0], rows[1] + [0, 0]])
    mask = torch.tensor([[1] * 6, [1] * 4 + [0, 0]])
    with torch.no_grad():
        got = token_logprobs(model, ids, mask)
        assert got.shape == (2, 5)
        for b, row in enumerate(rows):
            logits = model(torch.tensor([row])).logits[0].float()
            manual = torch.log_softmax(logits, -1)[torch.arange(len(row) - 1), torch.tensor(row[1:])]
            torch.testing.assert_close(got[b, : len(row) - 1], manual, rtol=1e-4, atol=1e-5)
        assert torch.equal(got[1, 3:], torch.zeros(2))
        hot = token_logprobs(model, ids, mask, temperature=2.0)
        logits = model(torch.tensor([rows[0]])).logits[0, :-1].float() / 2.0
        manual = torch.log_softmax(logits, -1).gather(-1, torch.tensor(rows[0][1:])[:, None])[:, 0]
        torch.testing.assert_close(hot[0], manual, rtol=1e-4, atol=1e-5)
        # Left padding gives the same log-probs for the real tokens (positions follow the mask).
        left = token_logprobs(model, torch.tensor([[0, 0] + rows[1]]), torch.tensor([[0, 0, 1, 1, 1, 1]]))
        torch.testing.assert_close(left[0, 2:], got[1, :3], rtol=1e-4, atol=1e-5)


def test_token_logprobs_skip_scores_only_the_later_targets_with_the_same_values(tiny_dir):
    """``skip`` runs the output head on fewer positions (``logits_to_keep``); what it returns is the
    tail of the full answer, exactly, padding included; a skip past the last target is refused."""
    model = load_model(str(tiny_dir))
    ids = torch.tensor([[1, 5, 11, 15, 80, 12], [1, 5, 19, 13, 0, 0]])
    mask = torch.tensor([[1] * 6, [1] * 4 + [0, 0]])
    with torch.no_grad():
        full = token_logprobs(model, ids, mask, temperature=0.7)
        for skip in (1, 3, 4):
            part = token_logprobs(model, ids, mask, temperature=0.7, skip=skip)
            assert part.shape == (2, 5 - skip)
            torch.testing.assert_close(part, full[:, skip:], rtol=1e-5, atol=1e-6)
        with pytest.raises(ValueError, match="skip"):
            token_logprobs(model, ids, mask, skip=5)


def test_encode_example_masks_only_answer_and_eos(tokenizer):
    ids, mask = encode_example(tokenizer, {"prompt": "37+45=", "answer": "82"})
    assert tokenizer.convert_ids_to_tokens(ids)[-3:] == ["8", "2", "<eos>"]
    assert mask == [0] * (len(ids) - 3) + [1, 1, 1]


def test_sft_warm_start_lowers_the_loss_deterministically(tmp_path, tokenizer):
    path = build_tiny_model(tmp_path / "m", hidden=64, layers=1, heads=2, seed=0)
    rows = make_rows(64, seed=0)
    runs = []
    for _ in range(2):
        model = load_model(str(path))
        runs.append(sft_warm_start(model, tokenizer, rows, steps=15, batch_size=16, lr=3e-3, seed=0))
        assert not model.training
    assert runs[0]["loss"] == runs[1]["loss"]
    assert runs[0]["loss"] < runs[0]["loss_start"]
    assert runs[0]["steps"] == 15 and runs[0]["examples"] == 64
    with pytest.raises(ValueError, match="answer"):
        sft_warm_start(model, tokenizer, [{"prompt": "1+1="}], steps=1, batch_size=1, lr=1e-3, seed=0)


def test_sft_stops_when_asked_and_greedy_accuracy_scores_replies(tiny_dir, tokenizer):
    model = load_model(str(tiny_dir))
    rows = make_rows(8, seed=0)
    seen = []

    def reward(messages, answer):
        seen.append((messages[0]["content"], messages[-1]["role"]))
        return 1.0

    assert greedy_accuracy(model, tokenizer, rows, reward, max_new_tokens=2, batch_size=3) == 1.0
    assert seen == [(row["prompt"], "assistant") for row in rows]
    stats = sft_warm_start(model, tokenizer, rows, steps=50, batch_size=4, lr=1e-3, seed=0,
                           stop_when=lambda: True, check_every=5)
    assert stats["steps"] == 5 and stats["stopped_early"]
