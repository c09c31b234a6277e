"""Freed CPU tensor memory given back to the system at once (glibc), not kept in the process's heap.

glibc's ``malloc`` serves a request below its mmap threshold from the heap, and raises that threshold
(up to 32 MiB) whenever a larger mapped block is freed, so after the first step nearly every
activation of a CPU train step comes from the heap. A step allocates and frees blocks of many sizes
between long-lived ones (gradients, optimizer state, the layers' saved inputs), and the heap can give
back only what lies free at its top: its high-water mark ends several times the live tensors' peak.
Measured (``bench/train_memory.py``, SmolLM2-135M, LoRA, 64 rows x 64 new tokens, one micro-batch):
5.96 GiB of RSS for the step with gradient checkpointing, 1.21 GiB once the threshold is fixed.

:func:`release_freed_memory` fixes the threshold at 128 KiB (``M_MMAP_THRESHOLD``; fixing it also
stops the raise): every block of that size or more is its own mapping, unmapped when freed, so the
process's RSS follows the live tensors. The cost is a page fault for every fresh page a block
touches: the same step took 23.8 s by default and 37 s with the threshold fixed (one run each, two
cores). It is process-wide (sampling in the same process too) and changes no number a step computes.
The trainer turns it on unless told otherwise where ``micro_batch = "auto"`` sizes on CPU: the sizer
estimates live tensors (:mod:`~rlvr.backends.train.micro_batch`), which the RSS then follows.

A backend module: standard library only.
"""

from __future__ import annotations

import ctypes
import platform

M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
THRESHOLD_BYTES = 128 * 1024  # glibc's own starting threshold


def release_freed_memory() -> str:
    """Fix glibc's mmap threshold for this process; what was done, in words (recorded by the trainer)."""
    libc = platform.libc_ver()[0]
    if libc != "glibc":
        return f"unchanged: not glibc ({libc or platform.system()})"
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None or not mallopt(M_MMAP_THRESHOLD, THRESHOLD_BYTES):
        return "unchanged: glibc refused mallopt(M_MMAP_THRESHOLD)"
    return f"glibc mmap threshold fixed at {THRESHOLD_BYTES // 1024} KiB"
