"""The progress display: a live panel only on a terminal outside CI (with rich), plain lines on a
pipe, in CI or without rich; ``[log] progress`` chooses, and the [log] section is checked at load."""

from __future__ import annotations

import builtins
import io

import pytest

from rlvr.cli.progress import PlainProgress, RichProgress, choose_display, progress_display
from rlvr.config.run import run_config_from_dict
from rlvr.errors import ConfigError
from rlvr.types import Phase, Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def report(step: int, phase: Phase = Phase.TRAIN) -> Progress:
    return Progress(step, 10, phase, 0.25, 0.5, 12.0, 321.0)


def test_auto_falls_back_to_plain_lines_when_not_a_terminal():
    out = io.StringIO()
    display = progress_display("auto", out, environ={})
    assert isinstance(display, PlainProgress)
    display(report(3, Phase.SAMPLE))  # only finished steps make a line
    display(report(3))
    display.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    assert "step    3/10 | pool 0.250 | held-out 0.500 | eta   12s | rss 321MB" in lines[0]
    assert "\x1b" not in out.getvalue()  # no terminal control codes in a log file


def test_auto_is_plain_in_ci_even_on_a_terminal():
    pytest.importorskip("rich")
    assert choose_display("auto", Terminal(), {"CI": "true"}) == "plain"
    assert choose_display("auto", Terminal(), {}) == "rich"


def test_auto_is_plain_without_rich(monkeypatch):
    real_import = builtins.__import__

    def no_rich(name, *args, **kwargs):
        if name == "rich" or name.startswith("rich."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_rich)
    assert choose_display("auto", Terminal(), {}) == "plain"
    assert choose_display("rich", Terminal(), {}) == "plain"


def test_explicit_modes():
    assert choose_display("plain", Terminal(), {}) == "plain"
    assert choose_display("off", Terminal(), {}) == "off"
    out = io.StringIO()
    silent = progress_display("off", out, environ={})
    silent(report(1))
    assert out.getvalue() == ""


def test_the_live_panel_shows_step_phase_rewards_eta_and_memory():
    pytest.importorskip("rich")
    out = Terminal()
    display = progress_display("auto", out, environ={})
    assert isinstance(display, RichProgress)
    display(report(4, Phase.HELDOUT))
    display(report(10, Phase.DONE))  # the end stops the live panel
    assert display.live is None
    text = out.getvalue()
    for part in ("step 10/10", "phase", "done", "pool reward 0.250", "held-out 0.500", "eta 12s", "rss 321 MB"):
        assert part in text, part


def test_log_section_defaults_and_refusals():
    log = run_config_from_dict({}).log
    assert (log.sinks, log.progress, log.log_samples_every, log.samples_per_step) == (["jsonl"], "auto", 10, 2)
    cfg = run_config_from_dict({"log": {"sinks": ["jsonl", "tensorboard", "mlflow", "wandb"], "project": "p"}})
    assert cfg.log.sinks == ["jsonl", "tensorboard", "mlflow", "wandb"]
    with pytest.raises(ConfigError, match="sinks"):
        run_config_from_dict({"log": {"sinks": ["neptune"]}})
    with pytest.raises(ConfigError, match="more than once"):
        run_config_from_dict({"log": {"sinks": ["wandb", "wandb"]}})
    with pytest.raises(ConfigError, match="progress"):
        run_config_from_dict({"log": {"progress": "fancy"}})


def test_a_held_out_pass_reports_its_rows_as_they_are_played(monkeypatch):
    import rlvr.run.evaluation as evaluation_module
    from conftest import make_rig, small_config
    from rlvr.run.evaluation import RolloutEvaluator
    from rlvr.testing import FakeRolloutFn, exact_match

    monkeypatch.setattr(evaluation_module, "ROWS_SHOWN_EVERY_S", 0.0)  # every row redrawn, so each is seen here
    got: list[Progress] = []
    rig = make_rig(small_config(max_steps=1, heldout_every=1), progress_cb=got.append)
    rig.loop.heldout_eval = RolloutEvaluator(FakeRolloutFn(0.5, max_delay=0.01), exact_match)
    rig.loop.run()
    n = len(rig.loop.heldout_tasks)
    step0 = [(p.rows_done, p.rows_total) for p in got if p.step == 0 and p.rows_total is not None]
    assert step0 == [(k, n) for k in range(n + 1)]  # 0/n when it starts, then every row to n/n
    assert all(p.phase is Phase.HELDOUT for p in got if p.rows_total is not None)
    assert all(p.rows_total is None for p in got if p.phase is not Phase.HELDOUT)


def test_the_displays_show_an_evaluations_rows_and_no_eta_once_done():
    pytest.importorskip("rich")
    panel = RichProgress(Terminal())
    heldout = Progress(0, 4, Phase.HELDOUT, None, None, None, 300.0, 12, 40)
    assert "phase heldout 12/40 rows" in _text(panel._render(heldout))
    done = Progress(4, 4, Phase.DONE, 0.3, 0.4, 55.0, 300.0)
    assert "eta" not in _text(panel._render(done))
    out = io.StringIO()
    plain = PlainProgress(out)
    plain(done)
    assert "eta" not in out.getvalue() and "step    4/4" in out.getvalue()
    plain.ROWS_EVERY_S = 0.0  # a long evaluation says where it is in a log too
    plain(heldout)
    assert out.getvalue().splitlines()[-1].endswith("step    0/4 | evaluating 12/40 rows")


def _text(renderable) -> str:
    from rich.console import Console

    console = Console(file=io.StringIO(), width=120)
    console.print(renderable)
    return console.file.getvalue()
