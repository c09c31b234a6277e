"""The trainer's checkpoint folder, in one of two layouts (``[train] checkpoint_layout``).

**Gathered** (the default): the PEFT adapter (``adapter/``, loadable by peft and vLLM as it is) or
the full weights (``weights.safetensors``), the optimizer's ``state_dict`` (``optimizer.pt``,
parameters numbered in trainable-parameter order) and ``trainer.json``. One process writes it:
under sharded ranks the weights and optimizer state are first gathered to rank 0.

**Sharded**: ``sharded/``, a ``torch.distributed.checkpoint`` (DCP) folder where every rank writes
its own shards of the trainable weights and of the optimizer state (one ``.distcp`` file per rank,
and the ``.metadata`` that says which piece of which tensor each holds), and ``trainer.json``
(rank 0). Nothing is gathered, so no process ever holds the whole state. DCP reshards on load: the
folder loads on any number of ranks, sharded (FSDP2, a 2-D mesh) or replicated, and into one
process whole (:func:`load_sharded`, which :func:`read_weights` uses for a plain model: ``rlvr
eval`` and ``rlvr export`` read it that way). State dicts are keyed by parameter name (DCP's
``get_model_state_dict`` / ``get_optimizer_state_dict``), so a checkpoint of another model or
LoRA setting is refused naming what is missing.

Invariants: every rank of a group calls :func:`save_sharded` / :func:`load_sharded` together (they
are collectives); the folder must be reachable from every rank at the same path (always on one
node; a shared filesystem across nodes). Only trainable parameters are written (LoRA: the adapter;
the frozen base comes from the run's base, as in the gathered layout).

A backend module: imports torch, safetensors and peft.
"""

from __future__ import annotations

import contextlib
import errno
import json
import re
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors import SafetensorError
from safetensors.torch import load_file, load_model, save_model
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from rlvr.errors import BackendError, exception_text

SHARDED_DIR = "sharded"  # DCP's folder inside the trainer's checkpoint folder
LAYOUTS = ("gathered", "sharded")
TRAINABLE = StateDictOptions(ignore_frozen_params=True)  # each rank's own shards, trainable weights only


def is_sharded_checkpoint(root: Path) -> bool:
    """Whether the trainer folder ``root`` holds the sharded (DCP) layout."""
    return (Path(root) / SHARDED_DIR / ".metadata").is_file()


def _in_group() -> bool:
    return dist.is_available() and dist.is_initialized()


@contextlib.contextmanager
def _one_process_quiet() -> Iterator[None]:
    """DCP warns that it assumes one process even when told so (``no_dist``): one process is meant here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def _state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    """What a sharded checkpoint holds, keyed by parameter name: DTensor shards under FSDP2, whole
    tensors otherwise. A fresh optimizer's state is made first (DCP loads into existing tensors)."""
    state: dict[str, Any] = {"model": get_model_state_dict(model, options=TRAINABLE)}
    if optimizer is not None:
        state["optimizer"] = get_optimizer_state_dict(model, optimizer, options=TRAINABLE)
    return state


def save_sharded(root: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 trainer_state: dict[str, Any]) -> None:
    """Every rank (a collective in a group): its shards of the weights and optimizer state into
    ``root/sharded/``; rank 0 (or the single process) writes ``trainer.json``."""
    root.mkdir(parents=True, exist_ok=True)
    with write_failures(root):
        with _one_process_quiet():
            dcp.save(_state(model, optimizer), checkpoint_id=str(root / SHARDED_DIR), no_dist=not _in_group())
        if not _in_group() or dist.get_rank() == 0:
            (root / "trainer.json").write_text(json.dumps(trainer_state))


def load_sharded(root: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    """Every rank (a collective in a group): this rank's pieces of ``root/sharded/``, whatever number of
    ranks wrote it, into ``model`` (and ``optimizer``); returns ``trainer.json``."""
    state = _state(model, optimizer)
    folder = root / SHARDED_DIR
    # DCP reports a key the checkpoint lacks inside a per-rank wrapper: compare the names first.
    held = {k.removeprefix("model.") for k in dcp.FileSystemReader(str(folder)).read_metadata().state_dict_metadata
            if k.startswith("model.")}
    missing, unexpected = sorted(set(state["model"]) - held), sorted(held - set(state["model"]))
    if missing or unexpected:
        raise BackendError(f"{folder}: the sharded checkpoint does not hold this policy's trainable weights (another "
                           f"model or LoRA setting): missing {missing[:3]}, unexpected {unexpected[:3]}")
    with _one_process_quiet():
        dcp.load(state, checkpoint_id=str(folder), no_dist=not _in_group())
    set_model_state_dict(model, state["model"], options=StateDictOptions(strict=False))
    if optimizer is not None:
        set_optimizer_state_dict(model, optimizer, state["optimizer"], options=TRAINABLE)
    return json.loads((root / "trainer.json").read_text())


def write_checkpoint(root: Path, model: torch.nn.Module, optimizer_state: dict[str, Any],
                     state: dict[str, Any]) -> None:
    """The gathered layout: the PEFT adapter (``adapter/``) or the full weights (``weights.safetensors``),
    the optimizer's ``state_dict`` (parameters numbered in the order of the trainable parameters) and
    ``trainer.json``."""
    from peft import PeftModel

    root.mkdir(parents=True, exist_ok=True)
    with write_failures(root):
        if isinstance(model, PeftModel):
            model.save_pretrained(str(root / "adapter"))
        else:
            save_model(model, str(root / "weights.safetensors"))  # handles tied embeddings
        torch.save(optimizer_state, root / "optimizer.pt")
        (root / "trainer.json").write_text(json.dumps(state))


def read_weights(root: Path, model: torch.nn.Module) -> None:
    """A checkpoint's adapter or full weights, in either layout, into ``model`` (unsharded, one process)."""
    from peft import PeftModel, set_peft_model_state_dict

    if is_sharded_checkpoint(root):
        if _in_group():
            raise BackendError(f"{root}: a sharded checkpoint is read by every rank together (the trainer's load)")
        load_sharded(root, model, None)
    elif isinstance(model, PeftModel):
        set_peft_model_state_dict(model, load_file(root / "adapter" / "adapter_model.safetensors"))
    else:
        load_model(model, str(root / "weights.safetensors"))


@contextlib.contextmanager
def write_failures(root: Path) -> Iterator[None]:
    """torch and safetensors report a failed write (a full disk) as their own errors, torch's without
    the cause ("unexpected pos 704 vs 598"): raise them as the ``OSError`` they are, with the free space
    left, so the caller's disk-error handling applies."""
    try:
        yield
    except OSError:
        raise
    except (RuntimeError, SafetensorError) as exc:
        try:
            free = f"; {shutil.disk_usage(root).free / 2**20:.1f} MiB free on its disk"
        except OSError:
            free = ""
        code = re.search(r"\(os error (\d+)\)", str(exc))  # safetensors keeps the OS's errno in its text
        raise OSError(int(code.group(1)) if code else errno.EIO, f"{exception_text(exc)}{free}", str(root)) from exc
