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
