"""The memory watchdog a run gets from its ``[watchdog]`` section (see :mod:`rlvr.run.watchdog`).

On a CUDA device the watchdog also reads the device's memory (``torch.cuda.mem_get_info``: free and
total on the device, every process's use included), counting as free what this process's caching
allocator holds but has not handed out (the trainer can still use it). A vLLM beside the trainer
reserves most of the device up front, which reads as used: so the CUDA levels are off unless set.
Part of the composition root: imports torch lazily, only for a CUDA device.
"""

from __future__ import annotations

from collections.abc import Callable

from rlvr.config.run import RunConfig
from rlvr.run.watchdog import CudaReader, MemoryWatchdog, WatchdogLevels, kernel_oom_choice, system_reader


def cuda_reader(device: str) -> CudaReader | None:
    """``() -> (used MiB, total MiB)`` of ``device`` when it is a CUDA device torch can see; else None."""
    if not device.startswith("cuda"):
        return None
    import torch

    if not torch.cuda.is_available():
        return None

    def read() -> tuple[float, float]:
        where = torch.device(device)
        free, total = torch.cuda.mem_get_info(where)
        cached = torch.cuda.memory_reserved(where) - torch.cuda.memory_allocated(where)
        return (total - free - cached) / 2**20, total / 2**20

    return read


def make_watchdog(cfg: RunConfig, log: Callable[[str], None] = print) -> MemoryWatchdog | None:
    """The run's watchdog, or None with ``watchdog.enabled = false``."""
    w = cfg.watchdog
    if not w.enabled:
        return None
    levels = WatchdogLevels(**w.model_dump(exclude={"enabled"}))
    return MemoryWatchdog(levels, reader=system_reader(cuda_reader(cfg.model.device)), log=log,
                          oom_choice=kernel_oom_choice)
