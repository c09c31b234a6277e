"""A base folder whose tokenizer config lists ``extra_special_tokens`` loads through a shadow folder: symlinks to
the original's files and one fixed ``tokenizer_config.json`` that every loader reads, the original untouched."""

from __future__ import annotations

import json
from collections.abc import Mapping

import pytest

pytest.importorskip("torch")

from rlvr.backends.model.io import load_model, load_tokenizer  # noqa: E402
from rlvr.backends.model.shadow import SHADOW_MARKER, TOKENIZER_CONFIG  # noqa: E402
from rlvr.backends.model.sources import resolve_base  # noqa: E402
from rlvr.backends.model.tiny import build_tiny_model  # noqa: E402

LISTED = ["<|user|>", "<|assistant|>"]


def strict_loader(folder):
    """What transformers 4 does with the config's ``extra_special_tokens``: it takes it as a mapping of
    names to tokens (``.keys()`` on a list raises), so a listed form fails there while loading."""
    config = json.loads((folder / TOKENIZER_CONFIG).read_text())
    extra = config.get("extra_special_tokens", {})
    if not isinstance(extra, Mapping):
        raise AttributeError(f"'{type(extra).__name__}' object has no attribute 'keys'")
    return config


@pytest.fixture(scope="module")
def listed_folder(tmp_path_factory):
    """A tiny model folder as such an export leaves it: its tokenizer config lists two tokens."""
    folder = tmp_path_factory.mktemp("export") / "merged"
    build_tiny_model(folder)
    config = json.loads((folder / TOKENIZER_CONFIG).read_text())
    (folder / TOKENIZER_CONFIG).write_text(json.dumps({**config, "extra_special_tokens": LISTED}))
    return folder


def test_a_listed_extra_special_tokens_folder_loads_through_a_shadow(listed_folder, tmp_path):
    with pytest.raises(AttributeError):
        strict_loader(listed_folder)  # the folder as it is fails in such a loader
    before = {p.name: p.read_bytes() for p in listed_folder.iterdir() if p.is_file()}
    source = resolve_base(str(listed_folder), cache_dir=tmp_path / "cache", fetch=pytest.fail)
    shadow = tmp_path / "cache" / "models" / source.path.rsplit("/", 1)[-1]
    assert source.path != str(listed_folder) and shadow.is_dir() and source.shadow_of == str(listed_folder)
    assert source.describe()["shadow_of"] == str(listed_folder)
    config = strict_loader(shadow)  # the shadow's config loads there
    assert "extra_special_tokens" not in config and config["additional_special_tokens"] == LISTED
    # Every other entry is a link to the original (the weights are never copied); the original is untouched.
    linked = {p.name for p in shadow.iterdir() if p.is_symlink()}
    assert linked == {p.name for p in listed_folder.iterdir()} - {TOKENIZER_CONFIG}
    assert all((shadow / n).resolve() == (listed_folder / n).resolve() for n in linked)
    assert before == {p.name: p.read_bytes() for p in listed_folder.iterdir() if p.is_file()}
    # The same tokenizer, and the same model, as the original loads to where the list is accepted.
    original, shadowed = load_tokenizer(str(listed_folder)), load_tokenizer(source.path)
    text = "<|user|>12+7=<|assistant|>19<eos>"
    assert shadowed(text)["input_ids"] == original(text)["input_ids"]
    assert shadowed.all_special_ids == original.all_special_ids and set(LISTED) <= set(shadowed.all_special_tokens)
    assert load_model(source.path).config.vocab_size == load_model(str(listed_folder)).config.vocab_size
    # Resolved again: the same shadow, not rebuilt; a changed config gets a shadow of its own.
    marker = (shadow / SHADOW_MARKER).stat().st_mtime_ns
    assert resolve_base(str(listed_folder), cache_dir=tmp_path / "cache") == source
    assert (shadow / SHADOW_MARKER).stat().st_mtime_ns == marker


def test_a_changed_folder_gets_a_new_shadow_and_a_plain_one_none(tmp_path):
    folder = tmp_path / "m"
    build_tiny_model(folder)
    assert resolve_base(str(folder), cache_dir=tmp_path / "cache").path == str(folder)  # nothing to fix
    assert not (tmp_path / "cache").exists()
    config = json.loads((folder / TOKENIZER_CONFIG).read_text())
    (folder / TOKENIZER_CONFIG).write_text(json.dumps({**config, "extra_special_tokens": ["<|tool|>"]}))
    first = resolve_base(str(folder), cache_dir=tmp_path / "cache")
    (folder / "notes.txt").write_text("added after the shadow was built")
    again = resolve_base(str(folder), cache_dir=tmp_path / "cache")
    assert again.path == first.path and (tmp_path / "cache" / "models" / again.path.rsplit("/", 1)[-1] / "notes.txt"
                                         ).is_symlink()
    (folder / TOKENIZER_CONFIG).write_text(json.dumps({**config, "extra_special_tokens": ["<|system|>"],
                                                       "additional_special_tokens": ["<|tool|>"]}))
    third = resolve_base(str(folder), cache_dir=tmp_path / "cache")
    fixed = json.loads((tmp_path / "cache" / "models" / third.path.rsplit("/", 1)[-1] / TOKENIZER_CONFIG).read_text())
    assert third.path != first.path and fixed["additional_special_tokens"] == ["<|tool|>", "<|system|>"]
