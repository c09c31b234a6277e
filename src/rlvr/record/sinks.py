"""Mirroring the run record to metric sinks, and choosing the sample completions it keeps.

:class:`SinkFanout` hands the recorder's config, per-step scalars and sample rows to every
:class:`~rlvr.protocols.MetricSink` it holds. It keeps two promises: a sink sees exactly what the
record holds (the recorder calls it at the point it writes, with the same values), and a sink that
raises is reported once (in one line, and as a ``warning`` event in the record) and then left out,
so a tracker can never stop a run. :func:`sample_rows` turns a step's groups into the flat rows of
``samples/step_N.jsonl`` (one per completion). Standard library only.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlvr.protocols import MetricSink
from rlvr.types import Group, Message


@dataclass(frozen=True, slots=True)
class SampleSchedule:
    """Every ``every`` steps (0: never), the first ``groups`` groups of the batch are kept."""

    every: int = 0
    groups: int = 2

    def due(self, step: int) -> bool:
        return self.every > 0 and self.groups > 0 and step % self.every == 0


def prompt_text(messages: Sequence[Message]) -> str:
    """A prompt as a person reads it: the content of a lone message, else ``role: content`` lines."""
    if len(messages) == 1:
        return str(messages[0].get("content", ""))
    return "\n".join(f"{m.get('role', '?')}: {m.get('content', '')}" for m in messages)


def sample_rows(step: int, groups: Iterable[Group], limit: int) -> list[dict[str, Any]]:
    """The first ``limit`` groups as table rows: one per completion, with its prompt, text, reward,
    advantage (the mean of its stream over rl tokens) and the policy version that sampled it."""
    rows = []
    for g_index, group in enumerate(list(groups)[:limit]):
        prompt = prompt_text(group.task.messages)
        for index, r in enumerate(group.rollouts):
            rows.append({"step": step, "group": g_index, "task_id": group.task.id, "env": group.task.env,
                         "sample": index, "prompt": prompt, "completion": r.text, "reward": r.reward,
                         "advantage": r.advantage, "version": r.version, "stop_reason": str(r.stop_reason),
                         "completion_len": len(r.completion_ids)})
    return rows


def heldout_scalars(score: float, by_env: Mapping[str, float] | None,
                    train_score: float | None = None) -> dict[str, float]:
    """A held-out event as sink scalars: ``heldout/score``, ``heldout/<env>`` per environment, and the
    training rows scored the same way with the gap (``heldout/train_score``, ``heldout/gap``)."""
    train = {} if train_score is None else {"heldout/train_score": train_score, "heldout/gap": train_score - score}
    return {"heldout/score": score, **{f"heldout/{env}": s for env, s in (by_env or {}).items()}, **train}


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class SinkFanout:
    """The sinks of one run session; each call reaches every sink still working."""

    def __init__(self, sinks: Sequence[MetricSink] = (), warn: Callable[[str], None] = _stderr):
        self.sinks = list(sinks)
        self.warn = warn
        self.on_failure: Callable[[str, str], object] | None = None  # (sink name, reason): the recorder's event
        self.failed: dict[str, str] = {}

    def __bool__(self) -> bool:
        return bool(self.sinks)

    def _each(self, what: str, call: Callable[[MetricSink], None]) -> None:
        for sink in list(self.sinks):
            try:
                call(sink)
            except Exception as exc:  # noqa: BLE001 - a tracker's failure of any kind must not end the run
                self._drop(sink, f"{what}: {type(exc).__name__}: {exc}")

    def _drop(self, sink: MetricSink, reason: str) -> None:
        name = getattr(sink, "name", type(sink).__name__)
        self.sinks.remove(sink)
        self.failed[name] = reason
        self.warn(f"rlvr: metric sink {name!r} failed ({reason}); the run goes on without it")
        if self.on_failure is not None:
            self.on_failure(name, reason)
        try:
            sink.close()
        except Exception:  # noqa: BLE001 - already reported; closing is a courtesy
            pass

    def log_config(self, config: Mapping[str, Any]) -> None:
        self._each("log_config", lambda s: s.log_config(config))

    def log_metrics(self, step: int, scalars: Mapping[str, float]) -> None:
        numbers = {k: float(v) for k, v in scalars.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"}
        self._each(f"log_metrics at step {step}", lambda s: s.log_metrics(step, numbers))

    def log_samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        self._each(f"log_samples at step {step}", lambda s: s.log_samples(step, rows))

    def close(self) -> None:
        self._each("close", lambda s: s.close())
        self.sinks.clear()
