"""transformers and peft against their validated windows: inside, outside (a warning, never a refusal),
and the versions with their windows in run.json."""

from __future__ import annotations

import json

import pytest

from rlvr.config import SUPPORTED_PEFT, SUPPORTED_TRANSFORMERS, engine_windows
from rlvr.config.loop import SUPPORTED_ENGINES, outside_windows


def test_the_installed_versions_are_inside_their_windows():
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    windows = engine_windows({"transformers": transformers.__version__, "peft": peft.__version__})
    assert windows == {"transformers": {"installed": transformers.__version__, "window": SUPPORTED_TRANSFORMERS,
                                        "inside": True},
                       "peft": {"installed": peft.__version__, "window": SUPPORTED_PEFT, "inside": True}}
    assert outside_windows(windows) == []


def test_a_version_outside_its_window_is_named_and_a_missing_or_odd_one_is_not_judged():
    windows = engine_windows({"transformers": "4.45.0", "peft": None})
    assert windows["transformers"]["inside"] is False and windows["peft"]["inside"] is None
    (warning,) = outside_windows(windows)
    assert warning.startswith(f"transformers 4.45.0 is outside the validated window {SUPPORTED_TRANSFORMERS!r} "
                              "(rlvr.config.SUPPORTED_TRANSFORMERS)")
    assert engine_windows({"transformers": "not-a-version", "peft": "0.21.2+local"}) == {
        "transformers": {"installed": "not-a-version", "window": SUPPORTED_TRANSFORMERS, "inside": None},
        "peft": {"installed": "0.21.2+local", "window": SUPPORTED_PEFT, "inside": True}}


@pytest.mark.train
def test_a_run_outside_the_window_starts_with_a_warning_and_records_versions_and_windows(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    import transformers

    from rlvr.config.run import run_config_from_dict
    from rlvr.wiring.seams import make_loop

    monkeypatch.setitem(SUPPORTED_ENGINES, "transformers", ">=99,<100")
    cfg = run_config_from_dict({
        "loop": {"max_steps": 1, "tasks_per_step": 2, "group_k": 2, "heldout_every": 1, "corpus_min": 20,
                 "heldout_frac": 0.2},
        "model": {"hidden": 16, "layers": 1, "heads": 2, "threads": 1},
        "task": {"n": 40}, "sft": {"steps": 0}, "sampler": {"max_new_tokens": 3}})
    said: list[str] = []
    make_loop(cfg, tmp_path / "run", log=said.append).run()
    warnings = [s for s in said if "outside the validated window" in s]
    assert warnings == [f"warning: transformers {transformers.__version__} is outside the validated window "
                        "'>=99,<100' (rlvr.config.SUPPORTED_TRANSFORMERS): the run goes on, but this version is "
                        "not one the test suite ran on"]
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["engine_windows"]["transformers"] == {"installed": transformers.__version__, "window": ">=99,<100",
                                                     "inside": False}
    assert run["engine_windows"]["peft"]["window"] == SUPPORTED_PEFT and run["engine_windows"]["peft"]["inside"]
    assert run["versions"]["transformers"] == transformers.__version__
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count("\n") == 1  # it trained its step
