"""Backends: the code behind the loop's seams that needs torch, transformers, peft or a server.

Nothing here is imported by ``import rlvr``. :func:`require_train_extra` is the friendly gate:
it names the extra to install when torch, transformers or peft is missing.
"""

from __future__ import annotations

from rlvr.errors import require_extra


def require_train_extra() -> None:
    require_extra("train", "torch", "transformers", "peft", "safetensors")
