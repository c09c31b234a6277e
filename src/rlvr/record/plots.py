"""The figures of ``rlvr report``: one PNG per view of a run record, drawn with matplotlib (Agg).

Each figure is made from the record alone (:class:`~rlvr.record.run_record.RunRecord`: events, metrics,
selection). A figure whose metrics the run does not have is not drawn: its function returns the
reason instead, and the page says it, so the page never shows an empty image. matplotlib is
imported only by :func:`draw_all` (the ``report`` extra), never by the core.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlvr.record.run_record import EventKind, RunRecord


@dataclass(frozen=True)
class Figure:
    """One figure of the page: its file (None when omitted), title, and a note or the reason."""

    name: str
    title: str
    file: str | None
    note: str


def series(record: RunRecord, key: str) -> tuple[list[int], list[float]]:
    """Steps and values of metric ``key`` over the rows that hold a number for it."""
    rows = [(m["step"], m[key]) for m in record.metrics if isinstance(m.get(key), (int, float))]
    return [s for s, _ in rows], [float(v) for _, v in rows]


def metric_keys(record: RunRecord, test: Callable[[str], bool]) -> list[str]:
    """Metric keys passing ``test`` that hold a number in at least one row."""
    return sorted({k for m in record.metrics for k, v in m.items()
                   if k != "step" and isinstance(v, (int, float)) and test(k)})


def selected_step(record: RunRecord) -> int | None:
    """selected.json's step, else (a run killed before one was written) the gate's latest best."""
    if record.selected_step is not None:
        return record.selected_step
    held = record.of_kind(EventKind.HELDOUT)
    return held[-1].data.get("best_step") if held else None


def eval_scores(record: RunRecord) -> dict[str, dict[int, float]]:
    """External eval sets' scores by step, from the held-out events."""
    out: dict[str, dict[int, float]] = {}
    for e in record.of_kind(EventKind.HELDOUT):
        for name, result in (e.data.get("eval") or {}).items():
            if result.get("score") is not None:
                out.setdefault(name, {})[e.step] = result["score"]
    return out


def train_eval_scores(record: RunRecord) -> dict[int, float]:
    """Training rows scored like held-out (greedy, same budget), by step, from the held-out events."""
    return {e.step: e.data["train_score"] for e in record.of_kind(EventKind.HELDOUT)
            if isinstance(e.data.get("train_score"), (int, float))}


def _lines(ax: Any, record: RunRecord, keys: list[str], **style: Any) -> int:
    drawn = 0
    for key in keys:
        steps, values = series(record, key)
        if steps:
            ax.plot(steps, values, marker=".", label=key, **style)
            drawn += 1
    return drawn


def living_model(plt: Any, record: RunRecord) -> tuple[Any, str]:
    pool, held = record.pool_scores, record.heldout_scores
    if not pool and not held:
        return None, "no step and no held-out evaluation recorded yet"
    fig, ax = plt.subplots(figsize=(8, 4.2))
    if pool:
        ax.plot(sorted(pool), [pool[s] for s in sorted(pool)], color="#bbb", marker=".",
                label="pool: mean reward of training samples (sampled)")
    train = train_eval_scores(record)
    if train:
        ax.plot(sorted(train), [train[s] for s in sorted(train)], color="#e67e22", marker="o", lw=2,
                label="training rows scored like held-out")
    if held:
        ax.plot(sorted(held), [held[s] for s in sorted(held)], color="#1f5fa8", marker="o", lw=2, label="held-out")
    by_env: dict[str, dict[int, float]] = {}
    for e in record.of_kind(EventKind.HELDOUT):
        for name, score in (e.data.get("by_env") or {}).items():
            by_env.setdefault(name, {})[e.step] = score
    for name, scores in sorted(by_env.items()):
        ax.plot(sorted(scores), [scores[s] for s in sorted(scores)], marker="o", ms=3, lw=1, label=f"held-out: {name}")
    for name, scores in sorted(eval_scores(record).items()):
        ax.plot(sorted(scores), [scores[s] for s in sorted(scores)], ls="--", marker="s", ms=3,
                label=f"eval set: {name} (not used for selection)")
    best = selected_step(record)
    note = "selection is by held-out only" + ("; the gap to watch is between the training rows scored like "
                                              "held-out and held-out" if train else "")
    if best is not None and best in held:
        ax.axvline(best, color="#c0392b", ls=":", lw=1)
        ax.plot([best], [held[best]], marker="*", ms=16, color="#c0392b", ls="none", label=f"selected: step {best}")
        note = f"selected step {best} (held-out {held[best]:.3f}); " + note
    ax.set_xlabel("step")
    ax.set_ylabel("score")
    ax.legend(fontsize=8)
    return fig, note


def reward(plt: Any, record: RunRecord) -> tuple[Any, str]:
    steps, mean = series(record, "rollout/reward")
    if not steps:
        return None, "no rollout/reward metric (no training step recorded)"
    fig, ax = plt.subplots(figsize=(8, 3.6))
    ax.plot(steps, mean, marker=".", label="reward mean")
    s2, std = series(record, "rollout/reward_std")
    if s2 == steps:
        ax.fill_between(steps, [m - d for m, d in zip(mean, std, strict=True)],
                        [m + d for m, d in zip(mean, std, strict=True)], alpha=0.2, label="± std")
    _lines(ax, record, metric_keys(record, lambda k: k.startswith("env/") and k.endswith("/reward")), lw=1)
    ax.set_xlabel("step")
    ax.legend(fontsize=8)
    return fig, "mean reward of the step's samples, shaded one standard deviation"


def length(plt: Any, record: RunRecord) -> tuple[Any, str]:
    steps, lengths = series(record, "rollout/completion_len")
    if not steps:
        return None, "no rollout/completion_len metric"
    fig, ax = plt.subplots(figsize=(8, 3.6))
    ax.plot(steps, lengths, marker=".", label="completion length (tokens)")
    ax.set_xlabel("step")
    ax.set_ylabel("tokens")
    s2, trunc = series(record, "rollout/truncated_frac")
    if s2:
        right = ax.twinx()
        right.plot(s2, trunc, color="#c0392b", marker=".", label="truncated fraction")
        right.set_ylabel("truncated fraction")
        right.set_ylim(-0.02, 1.02)
        right.legend(fontsize=8, loc="upper right")
    ax.legend(fontsize=8, loc="upper left")
    return fig, "mean completion length, and the fraction of samples cut at max_new_tokens"


def _panels(plt: Any, record: RunRecord, groups: list[tuple[str, list[str]]], what: str) -> tuple[Any, str]:
    groups = [(label, keys) for label, keys in groups if keys]
    if not groups:
        return None, f"the run records no {what} metrics"
    fig, axes = plt.subplots(1, len(groups), figsize=(8, 3.6), squeeze=False)
    for ax, (label, keys) in zip(axes[0], groups, strict=True):
        _lines(ax, record, keys)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    return fig, ", ".join(k for _, keys in groups for k in keys)


def kl_clip(plt: Any, record: RunRecord) -> tuple[Any, str]:
    kl = metric_keys(record, lambda k: "kl" in k.rsplit("/", 1)[-1])
    clip = metric_keys(record, lambda k: "clip" in k.rsplit("/", 1)[-1])
    return _panels(plt, record, [("KL", kl), ("clip fractions", clip)], "KL or clip-fraction")


def staleness(plt: Any, record: RunRecord) -> tuple[Any, str]:
    offsets = metric_keys(record, lambda k: k.startswith("async/version_offset"))
    ratios = [k for k in ("perf/wait_time_ratio", "perf/overlap_ratio") if series(record, k)[0]]
    return _panels(plt, record, [("staleness (versions behind)", offsets), ("wait / overlap", ratios)],
                   "staleness (async/version_offset_*) or wait/overlap (perf/*)")


def timings(plt: Any, record: RunRecord) -> tuple[Any, str]:
    times = metric_keys(record, lambda k: k.startswith("perf/") and k.endswith("_time"))
    return _panels(plt, record, [("seconds per step", times)], "timing (perf/*_time)")


def memory(plt: Any, record: RunRecord) -> tuple[Any, str]:
    # This process's resident memory and its per-phase peaks; system and device figures (available,
    # total, CUDA) are on another scale and would flatten these lines.
    rss = metric_keys(record, lambda k: k == "mem/rss_mb" or (k.startswith("mem/") and k.endswith("_peak_mb")
                                                               and "cuda" not in k))
    done = record.finished
    peaks = {k.removeprefix("mem/").removesuffix("_peak_mb"): v for k, v in (done.data if done else {}).items()
             if k.startswith("mem/") and k.endswith("_peak_mb") and "cuda" not in k and k != "mem/process_peak_mb"
             and isinstance(v, (int, float))}
    if not rss and not peaks:
        return None, "no mem/* metric and no finished event with phase peaks"
    fig, axes = plt.subplots(1, 2 if rss and peaks else 1, figsize=(8, 3.6), squeeze=False)
    if rss:
        _lines(axes[0][0], record, rss)
        axes[0][0].set_title("resident memory per step (MB)", fontsize=10)
        axes[0][0].set_xlabel("step")
        axes[0][0].legend(fontsize=7)
    if peaks:
        ax = axes[0][-1]
        ax.bar(list(peaks), list(peaks.values()), color="#1f5fa8")
        ax.set_title("peak RSS by phase (MB)", fontsize=10)
        ax.tick_params(axis="x", labelsize=8)
    note = "" if peaks else "phase peaks are in the finished event, which this run does not have (stopped midway)"
    return fig, note or "resident memory per step, and each phase's peak over the run"


PLOTS: list[tuple[str, str, Callable[[Any, RunRecord], tuple[Any, str]]]] = [
    ("living_model", "Pool vs held-out (the living-model chart)", living_model),
    ("reward", "Reward and its spread", reward),
    ("length", "Completion length and truncation", length),
    ("kl_clip", "KL and clip fractions", kl_clip),
    ("staleness", "Staleness and wait/overlap", staleness),
    ("timings", "Step timings", timings),
    ("memory", "Memory per phase", memory),
]


def draw_all(record: RunRecord, folder: Path) -> list[Figure]:
    """Every figure of :data:`PLOTS` that the record can fill, as ``folder/<name>.png``."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display, whatever the environment says
    import matplotlib.pyplot as plt

    figures = []
    for name, title, draw in PLOTS:
        fig, note = draw(plt, record)
        if fig is None:
            figures.append(Figure(name, title, None, note))
            continue
        fig.suptitle(title, fontsize=11)
        fig.tight_layout()  # after the title, so panel titles never run into it
        fig.savefig(folder / f"{name}.png", dpi=100, bbox_inches="tight")
        plt.close(fig)
        figures.append(Figure(name, title, f"{name}.png", note))
    return figures
