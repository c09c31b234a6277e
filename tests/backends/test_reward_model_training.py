"""Reward-model training (``rlvr rm train``): Bradley-Terry on preference pairs over the tiny model
built here, exported as a sequence classifier that ranks held-out pairs the right way and that
rlvr's own reward (``rm:FOLDER``) loads back with the scores it had when trained."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.train
torch = pytest.importorskip("torch")

from transformers import AutoModelForSequenceClassification  # noqa: E402

from rlvr.backends.model.tiny import build_tiny_model  # noqa: E402
from rlvr.backends.train.reward_model import PairScorer, read_pairs, split_pairs, train_reward_model  # noqa: E402
from rlvr.cli.commands import main  # noqa: E402
from rlvr.errors import DataError  # noqa: E402
from rlvr.wiring.reward_models import reward_model_env  # noqa: E402


def pairs_file(path, n=120, seed=0):
    """Sums answered plainly (chosen) or with a rambling tail (rejected): a preference a reward model
    can learn from the answer's text, over prompts it has to read past."""
    import random

    rng, tails = random.Random(seed), ["and more text", "i think", "or maybe not", "probably"]
    rows = []
    for _ in range(n):
        a, b = rng.randint(1, 49), rng.randint(1, 49)
        rows.append({"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": f"{a + b} {rng.choice(tails)}"})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("rm")
    base = build_tiny_model(root / "base", hidden=32, layers=2, heads=2, seed=0)
    data = pairs_file(root / "pairs.jsonl")
    report = train_reward_model(base, read_pairs(data), root / "rm", epochs=3, lr=3e-3, batch_size=8,
                                heldout_frac=0.25, seed=0, log=lambda _m: None)
    return root, data, report


def test_the_trained_model_ranks_held_out_pairs_better_than_chance(trained):
    _root, _data, report = trained
    before, after = report["heldout_before"], report["heldout_after"]
    print(json.dumps({k: report[k] for k in ("heldout_before", "heldout_after", "first_loss", "last_loss",
                                             "steps", "seconds")}))
    assert after["pairs"] == 30
    assert after["accuracy"] >= 0.9  # chance is 0.5
    assert after["mean_margin"] > before["mean_margin"] and after["mean_margin"] > 0
    assert report["last_loss"] < report["first_loss"]


def test_the_export_loads_back_as_rlvrs_reward_with_the_same_scores(trained):
    root, data, report = trained
    folder = root / "rm"
    model = AutoModelForSequenceClassification.from_pretrained(folder)
    assert model.config.num_labels == 1 and json.loads((folder / "rm_train.json").read_text())["steps"] > 0
    trained_side = PairScorer(folder)  # the exported weights, read the trainer's way
    _train, held = split_pairs(read_pairs(data), 0.25, 0)
    reward = reward_model_env(f"rm:{folder}", "cpu")  # what task.rewards = ["rm:FOLDER"] loads
    right = 0
    for pair in held:
        scores = [reward.reward_fn(convo, None) for convo in (pair.chosen, pair.rejected)]
        with torch.inference_mode():
            expected = trained_side.scores([trained_side.render(pair.chosen), trained_side.render(pair.rejected)])
        assert scores == pytest.approx(expected.tolist(), abs=1e-5)
        right += scores[0] > scores[1]
    assert right / len(held) == pytest.approx(report["heldout_after"]["accuracy"])  # the ranking it was trained to


def test_rlvr_rm_train_from_the_command_line(tmp_path, capsys):
    base = build_tiny_model(tmp_path / "base", hidden=16, layers=1, heads=2, seed=1)
    data = pairs_file(tmp_path / "pairs.jsonl", n=20)
    code = main(["rm", "train", "--base", str(base), "--data", str(data), "--out", str(tmp_path / "rm"),
                 "--lr", "1e-3", "--heldout-frac", "0.2"])
    assert code == 0
    out = capsys.readouterr().out
    assert "held-out ranking accuracy" in out and f"rm:{tmp_path / 'rm'}" in out
    assert (tmp_path / "rm" / "config.json").is_file()


def test_bad_pairs_are_refused_naming_the_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1=", "chosen": "2", "rejected": "3"}\n{"prompt": "x", "chosen": "y"}\n')
    with pytest.raises(DataError, match="line 2: no 'rejected'"):
        read_pairs(bad)
    bad.write_text('{"chosen": "a", "rejected": "a"}\n{"chosen": "b", "rejected": [{"role": "assistant"}]}\n')
    with pytest.raises(DataError, match="line 1: 'chosen' and 'rejected' are the same"):
        read_pairs(bad)
