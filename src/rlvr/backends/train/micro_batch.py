"""``micro_batch = "auto"``: the largest micro-batch whose forward-backward fits a memory budget.

The estimate for ``rows`` rows of a minibatch whose longest row has ``width`` tokens is
``rows x width x per_token + fixed``:

- ``per_token``: the bytes a forward keeps for its backward, per padded token, *measured* once, on
  a probe forward of the first ``PROBE_ROWS`` rows of the first minibatch in the trainer's own layout,
  precision and checkpointing, with gradients on: every storage the autograd graph saves is counted
  once (``torch.autograd.graph.saved_tensors_hooks``; parameters left out). The backward's
  transients are added as two layers' worth of the forward's activations (one layer's gradients;
  under checkpointing, one layer's activations rebuilt), ``2 x full / layers``, where ``full`` is the
  probe's count with checkpointing paused (the same count when it is off). The graph is dropped
  unused: the probe costs a forward of a few rows, once per run.
- ``fixed``: the output head's chunk buffers (:mod:`~rlvr.backends.model.head`: a few chunks of
  float32 logits), the trainable parameters' gradients (freed between steps) and, before the first
  optimizer step, AdamW's two moments.
- The budget, read at every minibatch: ``frac`` of the memory free now. CUDA: the device's free
  memory plus what this process's caching allocator holds unused. CPU: ``MemAvailable`` less the
  memory watchdog's floor (``floor_frac`` of ``MemTotal``), so the train step alone never takes
  the run to the point where the watchdog stops it.

``rows = clamp(floor((budget - fixed) / (width x per_token)), 1, n)``; a prompt shared by a group is
read once (:mod:`~rlvr.backends.train.shared_prefix`), so the estimate, counted on padded rows, errs
on the side of memory. The chosen size is reported per step (``train/micro_batch``).

``micro_batch_tokens`` caps each micro-batch by tokens as well (verl's ``ppo_max_token_len_per_gpu``):
:func:`cut_micro_batches` cuts a rank's share into contiguous micro-batches, in order, each of at most
the rows above and at most that many tokens the forward reads (packed: the rows' real tokens; padded:
rows x the longest). A row longer than the cap alone is refused, naming it. Cutting changes no number
beyond float rounding: each loss component is divided by its count over the whole minibatch.

A backend module: imports torch; reads ``/proc/meminfo`` through :mod:`rlvr.run.watchdog`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlvr.backends.model.head import HEAD_CHUNK_ELEMENTS
from rlvr.backends.train.checkpointing import checkpointing_paused, is_checkpointed
from rlvr.errors import BackendError
from rlvr.run.watchdog import meminfo_mb
from rlvr.types import Rollout

DEFAULT_BUDGET_FRAC = 0.5  # of the memory free when a minibatch is sized
PROBE_ROWS = 2
HEAD_CHUNK_BUFFERS = 4  # logits, probabilities and two products of one chunk at a time, float32


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    """What a sizing decision rests on, in bytes (its figures go to the step's metrics and the log)."""

    per_token: float
    fixed: float
    budget: float
    width: int
    rows: int

    def metrics(self) -> dict[str, float]:
        gib = 2.0**30
        return {"train/memory_budget_gib": self.budget / gib,
                "train/memory_estimate_gib": (self.rows * self.width * self.per_token + self.fixed) / gib}

    def line(self) -> str:
        return (f"train.micro_batch auto: {self.rows} rows of <= {self.width} tokens, estimated "
                f"{(self.rows * self.width * self.per_token + self.fixed) / 2**30:.2f} GiB of a "
                f"{self.budget / 2**30:.2f} GiB budget ({self.per_token / 2**10:.0f} KiB a token)")


def sizer_for(micro_batch: int | str, budget_frac: float, floor_frac: float, device: str,
              log: Callable[[str], None] | None = None) -> MicroBatchSizer | None:
    """The sizer for ``micro_batch = "auto"``; ``None`` for a number of rows (checked here)."""
    if micro_batch == "auto":
        return MicroBatchSizer(budget_frac=budget_frac, floor_frac=floor_frac, device=device, log=log)
    if isinstance(micro_batch, bool) or not isinstance(micro_batch, int) or micro_batch < 1:
        raise ValueError(f"train.micro_batch must be a number of rows >= 1 or 'auto', got {micro_batch!r}")
    return None


def memory_description(sizer: MicroBatchSizer | None) -> dict[str, float]:
    """What a trainer's description says of its sizing."""
    if sizer is None:
        return {}
    return {"memory_budget_frac": sizer.budget_frac, "memory_floor_frac": sizer.floor_frac}


class MicroBatchSizer:
    """Sizes micro-batches for one trainer: ``rows(rollouts, probe)`` (see the module docstring). Each
    decision is in ``last``; ``log`` hears the first and every one that moves by a quarter or more."""

    def __init__(self, *, budget_frac: float, floor_frac: float = 0.0, device: str = "cpu",
                 log: Callable[[str], None] | None = None):
        if not 0 < budget_frac <= 1:
            raise ValueError(f"train.memory_budget_frac must be in (0, 1], got {budget_frac}")
        self.budget_frac, self.floor_frac, self.device, self.log = budget_frac, floor_frac, device, log
        self.per_token: float | None = None
        self.last: MemoryEstimate | None = None
        self.logged_rows = 0

    def rows(self, rollouts: Sequence[Rollout], model: Any, optimizer: torch.optim.Optimizer,
             probe: Callable[[Sequence[Rollout]], Any]) -> int:
        """The micro-batch size for ``rollouts`` (one minibatch) now; ``probe(rows)`` runs the trainer's
        forward over a few rows with gradients on (measured once)."""
        if not rollouts:
            return 1
        width = max(len(r.prompt_ids) + len(r.completion_ids) for r in rollouts)
        if self.per_token is None:
            self.per_token = measure_per_token(model, rollouts[:PROBE_ROWS], probe)
        fixed = fixed_bytes(model, optimizer)
        budget = self.budget_frac * free_bytes(self.device, self.floor_frac)
        rows = math.floor((budget - fixed) / max(1.0, width * self.per_token))
        rows = max(1, min(len(rollouts), rows))
        self.last = MemoryEstimate(self.per_token, fixed, budget, width, rows)
        if self.log is not None and abs(rows - self.logged_rows) * 4 >= max(1, self.logged_rows):
            self.log(self.last.line())
            self.logged_rows = rows
        return rows


def measure_per_token(model: Any, rows: Sequence[Rollout], probe: Callable[[Sequence[Rollout]], Any]) -> float:
    """Bytes per padded token a forward keeps for its backward, with the backward's transients (see the
    module docstring), from a probe forward over ``rows``."""
    tokens = len(rows) * max(len(r.prompt_ids) + len(r.completion_ids) for r in rows)
    saved = saved_bytes(model, lambda: probe(rows))
    full = saved
    if is_checkpointed(model):
        with checkpointing_paused(model):
            full = saved_bytes(model, lambda: probe(rows))
    return (saved + 2 * full / _layers(model)) / tokens


def saved_bytes(model: Any, forward: Callable[[], Any]) -> int:
    """Bytes of the distinct storages (parameters excepted) that ``forward()``'s autograd graph saves."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if not isinstance(tensor, torch.nn.Parameter):
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in params:
                storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = forward()
    del out  # the graph goes unused
    return sum(storages.values())


def fixed_bytes(model: Any, optimizer: torch.optim.Optimizer) -> float:
    """The head's chunk buffers, the trainable gradients, and AdamW's moments when not yet allocated."""
    trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    moments = 0 if optimizer.state else 2 * trainable
    return HEAD_CHUNK_BUFFERS * HEAD_CHUNK_ELEMENTS * 4 + trainable + moments


def free_bytes(device: str, floor_frac: float = 0.0) -> float:
    """Memory free for the train step now: on CUDA the device's free memory plus this process's cached,
    unused blocks; elsewhere ``MemAvailable`` less ``floor_frac`` of ``MemTotal``."""
    where = torch.device(device)
    if where.type == "cuda":
        free, _ = torch.cuda.mem_get_info(where)
        return float(free + torch.cuda.memory_reserved(where) - torch.cuda.memory_allocated(where))
    available, total = meminfo_mb()
    if available is None or total is None:
        raise BackendError("train.micro_batch = 'auto' reads free memory from /proc/meminfo, which this system "
                           "lacks; set train.micro_batch to a number of rows")
    return max(0.0, available - floor_frac * total) * 2**20


def _layers(model: Any) -> int:
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return max(1, int(getattr(text, "num_hidden_layers", 1) or 1))


def forward_tokens(rollouts: Sequence[Rollout], packed: bool) -> int:
    """Tokens one forward over ``rollouts`` reads: their real tokens packed into one row, else rows x the longest."""
    lengths = [len(r.prompt_ids) + len(r.completion_ids) for r in rollouts]
    if not lengths:
        return 0
    return sum(lengths) if packed else len(lengths) * max(lengths)


def cut_micro_batches(rollouts: Sequence[Rollout], rows: int, max_tokens: int | None, packed: bool) -> list[slice]:
    """Contiguous micro-batches covering ``rollouts`` in order, each of at most ``rows`` rows and, with
    ``max_tokens``, at most that many forward tokens (:func:`forward_tokens`); greedy, so deterministic
    and the same on every rank that cuts the same share."""
    cuts: list[slice] = []
    start = 0
    while start < len(rollouts):
        end = start + 1
        if max_tokens is not None and forward_tokens(rollouts[start:end], packed) > max_tokens:
            r = rollouts[start]
            raise BackendError(
                f"train.micro_batch_tokens = {max_tokens}, but a rollout of row {r.task_id!r} alone reads "
                f"{len(r.prompt_ids) + len(r.completion_ids)} tokens ({len(r.prompt_ids)} prompt + "
                f"{len(r.completion_ids)} completion): raise train.micro_batch_tokens to at least the longest "
                "prompt plus sampler.max_new_tokens")
        while end < len(rollouts) and end - start < rows and (
                max_tokens is None or forward_tokens(rollouts[start:end + 1], packed) <= max_tokens):
            end += 1
        cuts.append(slice(start, end))
        start = end
    return cuts
