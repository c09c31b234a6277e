"""``rlvr report`` on fake-backend records (finished, and killed midway with torn lines), the page
checked in headless Chromium, and external eval sets: recorded, plotted, never selecting.

No torch: the records come from the fakes of ``rlvr.testing``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import make_rig
from rlvr.cli.commands import main
from rlvr.data.tasks import load_tasks
from rlvr.record.plots import PLOTS, eval_scores
from rlvr.record.report import write_report
from rlvr.record.run_record import read_record
from rlvr.testing import make_rows
from rlvr.types import EvalReport
from support.page_check import loaded_images

HELDOUT = {0: 0.1, 3: 0.2, 6: 0.5, 8: 0.3}   # held-out picks step 6
EXTERNAL = {0: 0.9, 3: 0.95, 6: 0.1, 8: 0.2}  # the eval set alone would pick step 3
EVAL_SET = load_tasks([{**r, "id": f"ext{i}"} for i, r in enumerate(make_rows(6, seed=9))])


class SplitScores:
    """Held-out scores from HELDOUT; the eval set's (its ids start with ``ext``) from EXTERNAL."""

    def __init__(self):
        self.calls: list[tuple[int, bool]] = []

    def __call__(self, step, tasks):
        external = all(t.id.startswith("ext") for t in tasks)
        self.calls.append((step, external))
        score = (EXTERNAL if external else HELDOUT)[step]
        return EvalReport(step, score, len(tasks), {t.id: score for t in tasks})


def run(folder: Path, **kwargs) -> Path:
    rig = make_rig(out_dir=folder, **kwargs)
    if "heldout_eval" not in kwargs:
        rig.loop.heldout_eval = SplitScores()
    rig.loop.run()
    return folder


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    return run(tmp_path_factory.mktemp("runs") / "finished", eval_sets={"ext": EVAL_SET})


def test_eval_set_is_recorded_and_never_selects(finished, tmp_path):
    record = read_record(finished)
    plain = read_record(run(tmp_path / "plain"))
    assert record.selected_step == plain.selected_step == 6
    assert record.selected == plain.selected
    assert record.heldout_scores == plain.heldout_scores == HELDOUT
    assert eval_scores(record) == {"ext": EXTERNAL}
    rows = [m for m in record.metrics if "eval/ext/score" in m]
    assert {m["step"]: m["eval/ext/score"] for m in rows} == EXTERNAL
    assert all(m["eval/ext/n"] == len(EVAL_SET) for m in rows)
    assert record.finished.data["summary"]["eval_scores"] == {"ext": {str(k): v for k, v in EXTERNAL.items()}}


def test_report_draws_every_plot_the_record_can_fill(finished, capsys):
    assert main(["report", str(finished)]) == 0
    out = json.loads(capsys.readouterr().out)
    page = Path(out["page"])
    assert page == finished / "report" / "index.html" and out["selected"]["step"] == 6
    text = page.read_text()
    drawn = {p.stem for p in page.parent.glob("*.png")}
    assert drawn | set(out["omitted"]) == {name for name, _, _ in PLOTS} and not drawn & set(out["omitted"])
    assert "living_model" in drawn and "memory" in drawn and "staleness" in drawn
    assert out["omitted"] == {"kl_clip": "the run records no KL or clip-fraction metrics"}  # the fakes log no KL
    assert "not drawn: the run records no KL" in text
    assert "selected step 6" in text and "eval set: ext" not in text  # the legend is in the PNG, not the HTML
    for name in drawn:
        assert f'src="{name}.png"' in text


def kill_midway(src: Path, dst: Path) -> Path:
    """``src`` as a SIGKILL after step 5 leaves it: no selected/finished event, no selected.json,
    and a half-written last line in both JSONL files."""
    shutil.copytree(src, dst)
    (dst / "selected.json").unlink()
    events = [json.loads(line) for line in (dst / "events.jsonl").read_text().splitlines()]
    kept = [e for e in events if e["step"] <= 5 and e["kind"] not in ("selected", "finished")]
    (dst / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in kept) + '{"kind": "step", "st')
    metrics = [m for m in (dst / "metrics.jsonl").read_text().splitlines() if json.loads(m)["step"] <= 5]
    (dst / "metrics.jsonl").write_text("\n".join(metrics) + "\n" + '{"step": 6, "rollout/rew')
    return dst


def test_report_on_a_run_killed_midway(finished, tmp_path):
    killed = kill_midway(finished, tmp_path / "killed")
    record = read_record(killed)
    assert record.finished is None and record.selected is None
    written = write_report(killed)
    text = Path(written["page"]).read_text()
    assert "not finished: stopped midway" in text
    assert "step 3, held-out 0.200" in text and "the gate&#x27;s best so far" in text
    assert {Path(p).stem for p in written["plots"]} >= {"living_model", "reward", "length", "memory"}
    assert "no finished event" not in written["omitted"]


def test_page_images_load_in_headless_chromium(finished, tmp_path):
    page = Path(write_report(finished)["page"])
    pngs = sorted(p.name for p in page.parent.glob("*.png"))
    assert loaded_images(page) == {name: "yes" for name in pngs}
    # The check fails when an image is missing.
    (page.parent / pngs[0]).unlink()
    assert loaded_images(page)[pngs[0]] == "no"


def test_page_of_a_killed_run_loads_in_headless_chromium(finished, tmp_path):
    page = Path(write_report(kill_midway(finished, tmp_path / "killed"))["page"])
    images = loaded_images(page)
    assert images and set(images.values()) == {"yes"}
    assert set(images) == {p.name for p in page.parent.glob("*.png")}
