"""A tiny causal language model built locally: the model the CPU demo and the tests train.

:func:`build_tiny_model` writes an ordinary Hugging Face folder (config, safetensors weights,
``tokenizer.json``, chat template) that ``AutoModelForCausalLM.from_pretrained`` and
``AutoTokenizer.from_pretrained`` load with no network, plus ``rlvr_tiny.json`` recording how it
was built. Weights are randomly initialised from ``seed`` (the global torch RNG is left as found),
so the same arguments always give the same weights.

The tokenizer is character level: every printable ASCII character, tab and newline is one token,
and the special tokens (pad, bos, eos, unk and one marker per chat role) are single tokens too.
Short token sequences matter because every token costs time on a CPU; "37+45=" renders as a
10-token prompt.

A backend module: imports torch, transformers and tokenizers at the top; the core never imports it.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    LlamaConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

MARKER_FILE = "rlvr_tiny.json"
FORMAT_VERSION = 1

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
ROLES = ("system", "user", "assistant", "tool")
ROLE_TOKENS = tuple(f"<|{role}|>" for role in ROLES)
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK, *ROLE_TOKENS)
# Printable ASCII without the vertical whitespace that never appears in task text.
CHARACTERS = tuple(ch for ch in string.printable if ch not in "\r\x0b\x0c")

# One marker token per turn, then the content, then eos: eos doubles as end-of-turn, so greedy
# generation stops right after the answer and a conversation's rendering extends its prefix
# (the prompt with the generation marker, plus the reply and eos, is the next turn's prefix).
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{ raise_exception('unknown role ' + message['role'] + '; use system, user, assistant or tool') }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def build_tiny_model(
    out_dir: str | Path,
    *,
    hidden: int = 128,
    layers: int = 4,
    heads: int = 4,
    intermediate: int | None = None,
    seed: int = 0,
    arch: str = "llama",
    max_positions: int = 256,
) -> Path:
    """Build, save and return a randomly initialised tiny causal LM in ``out_dir``.

    ``arch``: ``"llama"`` or ``"qwen2"``. ``intermediate`` defaults to ``4 * hidden``.
    Existing files of the same names in ``out_dir`` are overwritten.
    """
    if hidden % heads:
        raise ValueError(f"tiny model: hidden={hidden} must be divisible by heads={heads}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    config = _build_config(
        arch,
        tokenizer,
        hidden=hidden,
        layers=layers,
        heads=heads,
        intermediate=intermediate or 4 * hidden,
        max_positions=max_positions,
    )
    # fork_rng: seeding for reproducible weights must not reseed the caller's global stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.update(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    marker = {
        "builder": "rlvr.backends.model.tiny",
        "format_version": FORMAT_VERSION,
        "arch": arch,
        "hidden": hidden,
        "layers": layers,
        "heads": heads,
        "intermediate": config.intermediate_size,
        "max_positions": max_positions,
        "seed": seed,
        "vocab_size": config.vocab_size,
        "n_params": sum(p.numel() for p in model.parameters()),
    }
    (out / MARKER_FILE).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
    return out


def build_tiny_classifier(out_dir: str | Path, *, hidden: int = 32, layers: int = 1, heads: int = 2,
                          num_labels: int = 1, seed: int = 0, max_positions: int = 256) -> Path:
    """Build, save and return a randomly initialised tiny sequence classifier (Llama body, a linear
    score head on the last real token) with the same tokenizer and chat template: the reward model
    tests train and score with (:mod:`rlvr.backends.model.reward_model`). Loads with
    ``AutoModelForSequenceClassification``; same arguments, same weights."""
    if hidden % heads:
        raise ValueError(f"tiny classifier: hidden={hidden} must be divisible by heads={heads}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    config = _build_config("llama", tokenizer, hidden=hidden, layers=layers, heads=heads, intermediate=4 * hidden,
                           max_positions=max_positions)
    config.num_labels = num_labels
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The character-level tokenizer with the chat template set."""
    vocab = {token: i for i, token in enumerate((*SPECIAL_TOKENS, *CHARACTERS))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # Split every character into its own piece; [\s\S] rather than '.' so newlines split too.
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    # Fuse joins pieces with no separator, so decode(encode(text)) == text.
    core.decoder = decoders.Fuse()
    core.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="right",
        model_max_length=4096,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _build_config(arch: str, tokenizer: PreTrainedTokenizerFast, **size: int):
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=size["hidden"],
        intermediate_size=size["intermediate"],
        num_hidden_layers=size["layers"],
        num_attention_heads=size["heads"],
        num_key_value_heads=size["heads"],
        max_position_embeddings=size["max_positions"],
        # Tied embeddings: at this size the output matrix would otherwise be a large share
        # of the parameters for no gain.
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    if arch == "llama":
        return LlamaConfig(**common)
    if arch == "qwen2":
        return Qwen2Config(**common, use_sliding_window=False)
    raise ValueError(f"tiny model: arch must be 'llama' or 'qwen2', got {arch!r}")
