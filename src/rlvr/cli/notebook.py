"""``rlvr.train(model=..., data=..., reward=..., **settings)``: a run from a notebook, in one call.

What it runs is exactly what ``rlvr train`` runs: the same :class:`~rlvr.config.run.RunConfig` (read
from ``config=`` if given, then the arguments, then the settings; validated the same way, unknown keys
answered the same way), the same run folder rules, split, warm start, held-out gate, selection and
record (:func:`rlvr.cli.commands.train_fresh`). In-memory data and reward functions are named in that
config as ``session:NAME`` (:mod:`rlvr.session`) and read through the same readers as files; what the
arguments may be is :mod:`rlvr.cli.inputs`. ``config.json`` in the run folder is the resolved config.

:class:`Run` is the same thing in two steps, as TRL's trainer object reads: build it (the config is
resolved and checked at once: ``run.config``), then ``run.train()``. Both return the
:class:`~rlvr.record.run_record.RunRecord`; ``record.selected_checkpoint`` is the published checkpoint's folder.
``resume=True`` continues the run in ``out`` (same data, rewards and settings; ``max_steps`` may grow).
Part of the composition root: torch is imported only when a run starts.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rlvr.cli.inputs import (
    fill,
    merge,
    model_section,
    place_settings,
    reward_entries,
    setting_origins,
    table_rows,
    task_section,
)
from rlvr.config.run import RunConfig, read_config_file, run_config_from_dict
from rlvr.errors import ConfigError
from rlvr.record.run_record import RunRecord
from rlvr.session import registered

__all__ = ["Run", "train"]


class Run:
    """A run built from Python objects; :meth:`train` runs it (see the module doc)."""

    def __init__(self, model: Any = None, data: Any = None, reward: Any = None, *, out: str | Path | None = None,
                 config: str | Path | None = None, resume: bool = False, **settings: Any):
        self.out = Path(out) if out is not None else Path("runs") / time.strftime("%Y%m%d-%H%M%S")
        self.resume = resume
        self._file = read_config_file(config) if config is not None else {}
        self._origin = str(config) if config is not None else "rlvr.train"
        # No model=: the config file's own [model] (the tiny model when it names none); model= replaces it.
        self._model = model_section(model) if model is not None else {}
        if model is not None:
            self._file = _without_model(self._file)
        self._objects: dict[str, Any] = {}
        self._task: dict[str, Any] = {}
        if data is not None:
            if isinstance(data, (str, Path)):
                self._task["data"] = str(data)
            else:
                self._objects["data"] = table_rows(data)
                self._task["data"] = "{data}"
        if reward is not None:
            objects, specs = reward_entries(reward)
            clash = set(objects) & set(self._objects)
            if clash:
                raise ConfigError(f"a reward is named {sorted(clash)[0]!r}, like the data; rename the function")
            self._objects.update(objects)
            self._task.update(task_section(specs))
        self._settings = place_settings(settings, keep_unknown=True)  # refused with the file's unknown keys
        if reward is None and data is not None and not _has_reward(merge(self._file, self._settings)):
            raise ConfigError("data= needs reward=: a function reward_fn(messages, answer) or TRL's "
                              "fn(completions, **kwargs), or a built-in name such as 'exact_match' or 'math'")
        self.config  # noqa: B018 - resolved and checked now: a bad setting fails here, not at train()

    @contextmanager
    def _session(self) -> Iterator[RunConfig]:
        """The config, with this run's in-memory objects registered for the block."""
        with registered(self._objects) as specs:
            task = {k: ([fill(s, specs) for s in v] if isinstance(v, list) else fill(v, specs))
                    for k, v in self._task.items()}
            given = {"model": self._model, **({"task": task} if task else {})}
            yield run_config_from_dict(merge(merge(self._file, given), self._settings), self._origin,
                                       setting_origins(self._settings))

    @property
    def config(self) -> RunConfig:
        """The resolved run config (what config.json will hold)."""
        with self._session() as cfg:
            return cfg

    def train(self) -> RunRecord:
        """Run it (or, with ``resume=True`` and a run in ``out``, continue it); the run record."""
        from rlvr.backends import require_train_extra

        require_train_extra()
        from rlvr.cli.commands import summary_lines, train_fresh
        from rlvr.record.run_record import complete_checkpoints, read_record

        with self._session() as cfg:
            if self.resume and complete_checkpoints(self.out):
                loop = _resume(cfg, self.out)
            else:
                loop = train_fresh(cfg, self.out)
        if loop.abort_reason is not None:
            print(f"rlvr: stopped at step {loop.step}: {loop.abort_reason}; train again with resume=True to "
                  "continue it")
        else:
            print("\n" + "\n".join(summary_lines(loop.summary(), self.out)))
        return read_record(self.out)


def train(model: Any = None, data: Any = None, reward: Any = None, *, out: str | Path | None = None,
          config: str | Path | None = None, resume: bool = False, **settings: Any) -> RunRecord:
    """Train ``model`` (``"tiny"``, ``"smollm2"``, a hub name, a folder, a GGUF file; default: the ``config``
    file's model, else the tiny one) on ``data`` with ``reward``, exactly as ``rlvr train`` would; the run record
    (``record.selected_checkpoint``: the checkpoint held-out selected). See :mod:`rlvr.cli.notebook`."""
    return Run(model, data, reward, out=out, config=config, resume=resume, **settings).train()


def _without_model(file: dict[str, Any]) -> dict[str, Any]:
    """A config file's tables less the model it names (``model.base``, ``model.tiny``, ``loop.base``)."""
    drop = {"model": ("base", "tiny"), "loop": ("base",)}
    return {name: ({k: v for k, v in body.items() if k not in drop[name]} if name in drop and isinstance(body, dict)
                   else body) for name, body in file.items()}


def _has_reward(file: dict[str, Any]) -> bool:
    task = file.get("task") or {}
    return bool(task.get("env") or task.get("rewards") or file.get("envs"))


def _resume(cfg: RunConfig, out: Path) -> Any:
    """``rlvr resume`` for a run started from Python: the config must be the run's (``max_steps`` aside)."""
    from rlvr.cli.progress import progress_display
    from rlvr.wiring.seams import make_loop, saved_config

    saved = saved_config(out)
    then, now = saved.model_dump(mode="json"), cfg.model_dump(mode="json")
    then["loop"].pop("max_steps")
    now["loop"].pop("max_steps")
    changed = sorted(f"{s}.{k}" for s in now for k in (now[s] if isinstance(now[s], dict) else {})
                     if isinstance(then.get(s), dict) and then[s].get(k) != now[s].get(k))
    if changed:
        raise ConfigError(f"resume=True: {out} holds a run with other settings ({', '.join(changed[:5])}); give the "
                          "ones it started with (only max_steps may change), or another out=")
    display = progress_display(cfg.log.progress)
    try:
        loop = make_loop(cfg, out, progress_cb=display)
        loop.run(resume=True)
    finally:
        display.close()
    return loop
