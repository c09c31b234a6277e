"""The KV cache is passed by the keyword the model class names: ``cache`` where transformers renamed
``past_key_values`` (deprecated in 5.2x, removed in 5.40), ``past_key_values`` on older classes and
on remote code that kept it; a PEFT wrapper is looked through."""

from __future__ import annotations

import inspect

import pytest

pytest.importorskip("transformers")

from rlvr.backends.model.io import cache_kwarg  # noqa: E402


class Renamed:
    def forward(self, input_ids=None, cache=None, use_cache=None, **kwargs):
        return None


class Older:
    def forward(self, input_ids=None, past_key_values=None, use_cache=None, **kwargs):
        return None


class Wrapped:
    """What PEFT's model looks like from outside: its base model through ``get_base_model``."""

    def __init__(self, inner):
        self.inner = inner

    def get_base_model(self):
        return self.inner

    def forward(self, *args, **kwargs):
        return None


def test_the_keyword_follows_the_model_class():
    assert cache_kwarg(Renamed()) == "cache"
    assert cache_kwarg(Older()) == "past_key_values"
    assert cache_kwarg(Wrapped(Renamed())) == "cache" and cache_kwarg(Wrapped(Older())) == "past_key_values"


def test_the_installed_llama_takes_the_keyword_chosen_for_it():
    from transformers import LlamaForCausalLM, LlamaModel

    for cls in (LlamaForCausalLM, LlamaModel):
        assert cache_kwarg(cls.__new__(cls)) in inspect.signature(cls.forward).parameters
