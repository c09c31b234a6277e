"""``rlvr export --gguf``: a run over a GGUF base exports its selected checkpoint merged into the base and
re-quantised as the base's file (same metadata and tokenizer, each tensor in its type), and rlvr's own GGUF
loader loads it back to the merged model re-quantised: equal logits within float32 rounding (1e-5; the
quantisation's own error is the distance from there to the unquantised merged model), and the training's
change carried over."""

from __future__ import annotations

import copy
import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")
gguf = pytest.importorskip("gguf")

import torch  # noqa: E402

from rlvr.backends.model.io import load_model  # noqa: E402
from rlvr.backends.model.sources import resolve_base  # noqa: E402
from rlvr.cli.commands import main  # noqa: E402
from support.tiny_gguf import tiny_gguf  # noqa: E402

pytestmark = pytest.mark.train

ENV = '''
def make_rows(n, seed=0):
    return [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(n)]


def reward_fn(messages, answer):
    return float(len(messages[-1]["content"]) % 2)  # varies within a group: the policy gets a gradient
'''
IDS = torch.tensor([[1, 200, 300, 4000, 5000, 49000, 17, 2]])


def requantised(model, source):
    """``model`` with every weight quantised and dequantised in the type ``source`` holds it in."""
    from gguf import quants

    from rlvr.backends.model.gguf_export import tensor_map

    kinds = {t.name: t.tensor_type for t in gguf.GGUFReader(str(source)).tensors}
    names = {weight: name for name, weight in tensor_map(model, "llama").items()}
    out = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in out.named_parameters():
            kind = kinds[names[name]]
            p.copy_(torch.from_numpy(quants.dequantize(quants.quantize(p.numpy(), kind), kind).reshape(p.shape)))
    return out


def logits(model):
    with torch.no_grad():
        return model(IDS).logits[0]


def test_a_run_over_a_gguf_base_exports_a_gguf_its_loader_loads_back(tmp_path, monkeypatch):
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path / "cache"))  # the conversions land here, not in the user's cache
    base = tiny_gguf(tmp_path / "Tiny-Chat.Q4_1.gguf")
    (tmp_path / "myenv.py").write_text(ENV)
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), f"--model.base={base}", f"--task.env={tmp_path / 'myenv.py'}",
                 "--task.n=120", "--model.threads=1", "--loop.max_steps=2", "--loop.tasks_per_step=2",
                 "--loop.group_k=4", "--loop.lora_rank=4", "--loop.lr=0.05", "--sampler.max_new_tokens=4",
                 "--log.progress=off", "--watchdog.enabled=false", "--loop.heldout_every=1"]) == 0
    # Step 2's checkpoint, which training moved (the selected one can be step 0, the base itself).
    assert main(["export", str(run), "--out", str(tmp_path / "export"), "--step", "2", "--gguf"]) == 0
    exported = tmp_path / "export" / "gguf" / base.name
    assert json.loads((tmp_path / "export" / "export.json").read_text())["gguf"] == f"gguf/{base.name}"
    # The same metadata (tokenizer, chat template, shape) and each tensor in the base's type.
    source, written = gguf.GGUFReader(str(base)), gguf.GGUFReader(str(exported))
    assert {f.name: f.contents() for f in source.fields.values() if not f.name.startswith("GGUF.")} == \
        {f.name: f.contents() for f in written.fields.values() if not f.name.startswith("GGUF.")}
    assert [(t.name, t.tensor_type) for t in source.tensors] == [(t.name, t.tensor_type) for t in written.tensors]
    # Loaded back through rlvr's GGUF loader: the merged model re-quantised, exactly.
    back = load_model(resolve_base(str(exported)).path)
    merged = load_model(str(tmp_path / "export" / "merged"))
    original = load_model(resolve_base(str(base)).path)
    expected = logits(requantised(merged, base))
    got = logits(back)
    assert (got - expected).abs().max().item() <= 1e-5
    # That is the quantisation's tolerance: the file differs from the unquantised merged model only by
    # re-quantising in the base's types (measured: printed), and the training's change survives it.
    quantisation = (got - logits(merged)).abs().max().item()
    trained = (got - logits(original)).abs().max().item()
    print(f"max |logit| gap: re-quantised vs unquantised merged {quantisation:.3g}, export vs base {trained:.3g}")
    assert trained > 1e-3, f"the export does not carry the trained change (logits moved {trained:.2e})"

def test_gguf_export_of_a_run_over_a_folder_is_refused_naming_the_base(tmp_path):
    from rlvr.cli.export import gguf_source
    from rlvr.config.run import run_config_from_dict
    from rlvr.errors import ConfigError

    with pytest.raises(ConfigError, match=r"model.base='org/model' is not a GGUF file"):
        gguf_source(tmp_path, run_config_from_dict({"model": {"base": "org/model"}}))
