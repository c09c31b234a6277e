"""What a person watching ``rlvr train`` sees: a live display, or one plain line per step.

:func:`progress_display` picks by ``[log] progress``: ``rich`` draws a live panel (step/max with a
bar, phase, an evaluation's rows done / total, pool reward, last held-out, ETA until done, memory)
with the optional ``rich`` package; ``plain`` prints one line per step (and, during a long
evaluation, its rows every 30 s); ``off`` prints nothing. ``auto`` is the live panel only when stdout is a
terminal, ``CI`` is unset and rich is installed, else plain lines, so logs and pipes never receive
terminal control codes. Either is a ``progress_cb`` (:class:`rlvr.types.Progress` in) with a
``close()`` the caller runs when the run ends, however it ends.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

from rlvr.types import Phase, Progress


def _score(x: float | None) -> str:
    return "  -  " if x is None else f"{x:.3f}"


def _duration(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def _rows(p: Progress) -> str:
    return "" if p.rows_total is None else f"{p.rows_done or 0}/{p.rows_total} rows"


class PlainProgress:
    """One line per finished step (and at the end), flushed at once so a log file follows the run; during
    a long evaluation, a line of its rows every ``ROWS_EVERY_S``. No ETA once the run is done."""

    ROWS_EVERY_S = 30.0

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream
        self.started = time.monotonic()
        self._rows_said = self.started

    def __call__(self, p: Progress) -> None:
        elapsed = time.monotonic() - self.started
        if p.phase is Phase.HELDOUT and p.rows_total is not None:
            if time.monotonic() - self._rows_said >= self.ROWS_EVERY_S and p.rows_done != p.rows_total:
                self._rows_said = time.monotonic()
                print(f"[{elapsed:6.1f}s] step {p.step:>4}/{p.max_steps} | evaluating {_rows(p)}",
                      file=self.stream or sys.stdout, flush=True)
            return
        if p.phase not in (Phase.TRAIN, Phase.DONE):
            return
        self._rows_said = time.monotonic()
        eta = "" if p.eta_s is None or p.phase is Phase.DONE else f" | eta {p.eta_s:4.0f}s"
        rss = "" if p.rss_mb is None else f" | rss {p.rss_mb:.0f}MB"
        print(f"[{elapsed:6.1f}s] step {p.step:>4}/{p.max_steps} | pool {_score(p.pool_score)} | "
              f"held-out {_score(p.last_heldout)}{eta}{rss}", file=self.stream or sys.stdout, flush=True)

    def close(self) -> None:
        pass


class RichProgress:
    """A live panel redrawn on every phase change; started on the first report, stopped by close()."""

    def __init__(self, stream: TextIO | None = None):
        from rich.console import Console

        self.console = Console(file=stream) if stream is not None else Console()
        self.live: Any = None
        self.started = time.monotonic()

    def _render(self, p: Progress) -> Any:
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        done = p.step if p.phase is Phase.DONE else max(p.step - 1, 0)  # steps finished, not begun
        grid = Table.grid(padding=(0, 2))
        rows = f" {_rows(p)}" if p.phase is Phase.HELDOUT and p.rows_total is not None else ""
        grid.add_row(f"[bold]step {p.step}/{p.max_steps}[/bold]",
                     ProgressBar(total=max(p.max_steps, 1), completed=min(done, p.max_steps), width=30),
                     f"phase [cyan]{p.phase}[/cyan]{rows}")
        eta = "" if p.phase is Phase.DONE else "eta -" if p.eta_s is None else f"eta {_duration(p.eta_s)}"
        rss = "-" if p.rss_mb is None else f"{p.rss_mb:.0f} MB"
        grid.add_row(f"pool reward {_score(p.pool_score)}", f"held-out {_score(p.last_heldout)}", f"rss {rss}")
        grid.add_row(f"elapsed {_duration(time.monotonic() - self.started)}", eta, "")
        return grid

    def __call__(self, p: Progress) -> None:
        if self.live is None:
            from rich.live import Live

            self.live = Live(self._render(p), console=self.console, refresh_per_second=4, transient=False)
            self.live.start()
        self.live.update(self._render(p), refresh=True)
        if p.phase is Phase.DONE:
            self.close()

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None


def choose_display(mode: str, stream: TextIO, environ: Mapping[str, str]) -> str:
    """``rich``, ``plain`` or ``off`` for ``[log] progress = mode`` on this output."""
    if mode in ("off", "plain"):
        return mode
    try:
        import rich  # noqa: F401
    except ImportError:
        if mode == "rich":
            print("rlvr: log.progress = 'rich' needs the rich package (pip install 'rlvr[track]'); "
                  "showing plain lines", file=sys.stderr)
        return "plain"
    if mode == "rich":
        return "rich"
    is_tty = getattr(stream, "isatty", lambda: False)()
    return "rich" if is_tty and not environ.get("CI") else "plain"


class _Silent:
    def __call__(self, p: Progress) -> None:
        pass

    def close(self) -> None:
        pass


def progress_display(mode: str = "auto", stream: TextIO | None = None,
                     environ: Mapping[str, str] | None = None) -> PlainProgress | RichProgress | _Silent:
    """The display ``[log] progress`` asks for, on ``stream`` (stdout by default)."""
    kind = choose_display(mode, stream or sys.stdout, os.environ if environ is None else environ)
    if kind == "rich":
        return RichProgress(stream)
    if kind == "plain":
        return PlainProgress(stream)
    return _Silent()
