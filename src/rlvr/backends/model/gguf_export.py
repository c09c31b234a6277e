"""A trained model written back to GGUF, in the shape and quantisation of the GGUF file its base came from.

The base's own file is the template: every metadata key (architecture, hyperparameters, tokenizer,
chat template, ``general.*``) is copied as it is, and every tensor the file holds is written again
under its name, in its quantisation type, from the trained model's weights. So the file loads where
the base's file loaded (transformers' GGUF loader, which :func:`rlvr.backends.model.sources.resolve_base`
uses; llama.cpp and the tools built on it), with the same tokenizer, and re-quantising costs what the
base's own quantisation cost: each tensor's error is that of its type on the new weights.

Invariants: a tensor's name maps to the model's weight through the same table transformers reads
the file with (``get_gguf_hf_weights_map``), so writing is the inverse of loading; for the llama
family the query and key rows are permuted back into llama.cpp's rotary layout (transformers undoes
that permutation on load). Every weight of the model has a place in the file (a tied output head
excepted) or the export fails naming the weight; an architecture whose loader changes values other
than by that permutation is refused, naming it. A type the ``gguf`` package cannot quantise into
(the k-quants) is written as Q8_0 and reported, never silently. The file is written under a
temporary name and renamed into place.

A backend module: imports numpy, gguf and transformers.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from rlvr.errors import ConfigError

PERMUTED = frozenset({"llama"})  # loaders that undo llama.cpp's rotary permutation of q and k rows
PLAIN = frozenset({"qwen2", "qwen3", "mistral", "phi3", "starcoder2", "stablelm", "olmo", "olmo2", "granite",
                   "smollm3"})


def _permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's layout of a query or key matrix (the inverse of transformers' reverse permutation)."""
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def _copy_metadata(reader: Any, writer: Any) -> None:
    import gguf

    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # written by the writer itself
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)


def _quantised(weights: np.ndarray, kind: Any) -> tuple[np.ndarray, Any, bool]:
    """``(data, type written, whether the type fell back to Q8_0)``."""
    from gguf import GGMLQuantizationType, quants

    try:
        return quants.quantize(weights, kind), kind, False
    except NotImplementedError:
        fallback = GGMLQuantizationType.Q8_0
        return quants.quantize(weights, fallback), fallback, True


def tensor_map(model: Any, arch: str) -> dict[str, str]:
    """GGUF tensor name -> the model's weight name, as transformers' GGUF loader maps them."""
    from transformers.modeling_gguf_pytorch_utils import TensorProcessor, get_gguf_hf_weights_map

    if arch not in PERMUTED | PLAIN:
        raise ConfigError(f"rlvr export --gguf: GGUF architecture {arch!r} is not one rlvr writes back (its loader "
                          f"changes tensor values on load); supported: {sorted(PERMUTED | PLAIN)}")
    return get_gguf_hf_weights_map(model, TensorProcessor(), model_type=arch)


def write_gguf(model: Any, source: Path, out: Path) -> dict[str, Any]:
    """Write ``model``'s weights into ``out`` shaped as the GGUF file ``source``; returns what was written
    (the file, its tensor types, the tensors that fell back to Q8_0)."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    arch = str(reader.fields[gguf.Keys.General.ARCHITECTURE].contents())
    names = tensor_map(model, arch)
    state = {k: v for k, v in model.state_dict().items()}
    config = model.config
    heads, kv_heads = config.num_attention_heads, getattr(config, "num_key_value_heads", config.num_attention_heads)
    written: set[str] = set()
    fell_back: list[str] = []
    types: dict[str, int] = {}
    tmp = out.with_name(out.name + ".tmp")
    writer = gguf.GGUFWriter(str(tmp), arch, endianess=reader.endianess)
    try:
        _copy_metadata(reader, writer)
        for tensor in reader.tensors:
            weight = names.get(tensor.name)
            if weight is None or weight not in state:
                raise ConfigError(f"rlvr export --gguf: {source.name} holds tensor {tensor.name!r}, which matches no "
                                  f"weight of the trained {type(model).__name__}")
            values = state[weight].detach().float().cpu().numpy()
            if arch in PERMUTED and ".attn_q." in tensor.name:
                values = _permute(values, heads)
            elif arch in PERMUTED and ".attn_k." in tensor.name:
                values = _permute(values, kv_heads)
            data, kind, fallback = _quantised(np.ascontiguousarray(values), tensor.tensor_type)
            if fallback:
                fell_back.append(tensor.name)
            plain = kind in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)
            writer.add_tensor(tensor.name, data, raw_dtype=None if plain else kind)
            types[kind.name] = types.get(kind.name, 0) + 1
            written.add(weight)
        _check_all_written(model, state, written)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return {"file": str(out), "source": source.name, "architecture": arch, "tensor_types": types,
            "fell_back_to_q8_0": fell_back}


def _check_all_written(model: Any, state: dict[str, Any], written: set[str]) -> None:
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    trained = {name for name, _ in model.named_parameters()} | {n for n in state if n.endswith(".weight")}
    left = sorted(trained - written - tied)
    if left:
        raise ConfigError(f"rlvr export --gguf: the GGUF file has no place for weights {left[:5]}"
                          f"{' …' if len(left) > 5 else ''}; export the merged/ folder instead")
