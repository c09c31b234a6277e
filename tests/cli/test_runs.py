"""Earlier runs read from their records: "has this been tried" before a run starts (identical runs, similar
ones with their differences, other data left out, run-only keys ignored) and ``rlvr runs`` (a table or
JSON, differences against a chosen run). Runs are made with the fakes; the CLI's own start says the same
in tests/e2e/test_cli_runs.py (a second identical `rlvr train` names the first and what it reached)."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import make_rig, small_config
from rlvr.cli.commands import main
from rlvr.record.history import config_differences, find_runs, run_summary
from rlvr.testing import make_rows
from rlvr.wiring.runs import say_earlier_tries

MODEL = {"tiny": True, "hidden": 32, "layers": 2, "heads": 2, "init_seed": 0, "threads": 1}


def run_config(loop, **sections) -> dict:
    return {"loop": loop.model_dump(mode="json"), "model": dict(MODEL), "log": {"progress": "off"}, **sections}


def make_run(out: Path, *, rows=None, scores=lambda s: 0.1 + 0.01 * s, **overrides) -> dict:
    """A finished fake run in ``out``, its run.json carrying a run config as `rlvr train` writes it."""
    sections = overrides.pop("sections", {})
    config = small_config(**overrides)
    resolved = run_config(config, **sections)
    rig = make_rig(config, rows=rows, scores=scores, out_dir=out, run_info={"run_config": resolved})
    rig.loop.run()
    return resolved


def test_a_run_identical_to_a_finished_one_is_told_what_that_one_reached(tmp_path):
    config = make_run(tmp_path / "first")
    split = run_summary(tmp_path / "first").split
    said: list[str] = []
    # run-only keys (where it logs, how it is watched) do not make a run different
    mine = {**config, "log": {"progress": "plain", "runs_root": str(tmp_path)}, "watchdog": {"enabled": False}}
    tries = say_earlier_tries(mine, split, tmp_path / "second", root=tmp_path, log=said.append)
    assert len(tries) == 1 and tries[0].identical
    assert said[0].startswith("has this been tried: 1 earlier run(s) under ") and "(1 with this very config)" in said[0]
    assert said[1].endswith("first: the same config; finished (max_steps) at step 8: selected step 8, held-out "
                            "0.180 (from 0.100 at step 0)")


def test_similar_runs_are_listed_with_their_differences_and_other_data_is_left_out(tmp_path):
    config = make_run(tmp_path / "a")
    make_run(tmp_path / "b", lr=3e-4, max_steps=6, scores=lambda s: 0.3)
    make_run(tmp_path / "other-data", rows=make_rows(40, seed=1))
    split = run_summary(tmp_path / "a").split
    said: list[str] = []
    tries = say_earlier_tries(config, split, tmp_path / "new", root=tmp_path, log=said.append)
    assert [t.run.path.name for t in tries] == ["a", "b"]  # identical first; other data is not a try
    assert said[2].endswith("b: differs in loop.lr 1e-05 (there 0.0003), loop.max_steps 8 (there 6); "
                            "finished (max_steps) at step 6: selected step 0, held-out 0.300 (from 0.300 at step 0)")


def test_nothing_earlier_is_said_in_one_line(tmp_path):
    said: list[str] = []
    assert say_earlier_tries(run_config(small_config()), {"train_hash": "x", "heldout_hash": "y"}, tmp_path / "r",
                             root=tmp_path, log=said.append) == []
    assert len(said) == 1 and said[0].startswith("has this been tried: no earlier run under")


def test_differences_are_flat_keys_with_run_only_keys_left_out():
    mine = {"loop": {"lr": 1e-4, "seed": 0}, "log": {"sinks": ["jsonl"]}, "cluster": {"backend": "ray"},
            "model": {"threads": 1, "hidden": 32}, "sampler": {"url": ["a"], "timeout_s": 5}}
    theirs = {"loop": {"lr": 1e-4, "seed": 1}, "log": {"sinks": ["wandb"]}, "cluster": {"backend": "local"},
              "model": {"threads": 2, "hidden": 64}, "sampler": {"url": ["b"], "timeout_s": 9}, "extra": {"k": 1}}
    assert config_differences(mine, theirs) == [("extra.k", None, 1), ("loop.seed", 0, 1),
                                                ("model.hidden", 32, 64), ("sampler.url", ["a"], ["b"])]


def test_rlvr_runs_lists_status_scores_and_differences_against_a_chosen_run(tmp_path, capsys):
    make_run(tmp_path / "a")
    make_run(tmp_path / "b", lr=3e-4)
    (tmp_path / "not-a-run").mkdir()
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / "run.json").write_text("{")  # half written: skipped, never an error
    assert main(["runs", str(tmp_path), "--vs", "a"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["run", "status", "base", "steps", "best", "held-out", "selected", "config", "vs",
                                "a"]
    assert lines[1].split()[:7] == ["a", "finished", "(max_steps)", "tiny(hidden=32,layers=2,heads=2,init_seed=0)",
                                    "8", "0.180", "8"] and lines[1].endswith("(reference)")
    assert lines[2].startswith("b ") and lines[2].endswith("loop.lr 0.0003 (there 1e-05)") and len(lines) == 3
    assert main(["runs", str(tmp_path), "--json"]) == 0  # default reference: the newest run
    data = json.loads(capsys.readouterr().out)
    assert data["reference"].endswith("b") and data["runs"][0]["differences"] == [
        {"key": "loop.lr", "this": 1e-05, "reference": 0.0003}]
    assert main(["runs", str(tmp_path), "--vs", "zzz"]) == 2
    assert "rlvr runs --vs zzz: no run of that name under" in capsys.readouterr().err


def test_a_run_still_going_or_failed_reads_as_such(tmp_path):
    make_run(tmp_path / "done")
    events = (tmp_path / "done" / "events.jsonl").read_text().splitlines()
    (tmp_path / "started").mkdir()
    (tmp_path / "started" / "run.json").write_text((tmp_path / "done" / "run.json").read_text())
    (tmp_path / "started" / "events.jsonl").write_text("\n".join(events[:3]) + "\n")
    statuses = {r.path.name: r.status for r in find_runs(tmp_path)}
    assert statuses == {"done": "finished (max_steps)", "started": "started"}


def test_a_folder_that_vanishes_while_runs_are_listed_is_skipped(tmp_path, monkeypatch):
    (tmp_path / "gone" / "seed0").mkdir(parents=True)
    (tmp_path / "kept").mkdir()
    real_iterdir = Path.iterdir

    def iterdir(self):
        if self.name == "gone":  # removed by another process between the listing and the look inside
            raise FileNotFoundError(self)
        return real_iterdir(self)

    monkeypatch.setattr(Path, "iterdir", iterdir)
    assert find_runs(tmp_path) == []
