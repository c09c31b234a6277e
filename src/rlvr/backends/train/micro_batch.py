"""``micro_batch = "auto"``: the largest micro-batch whose forward-backward fits a memory budget.

The estimate is what a train step adds to the process's memory (on CPU: its RSS above what was
resident when the step began). For ``rows`` rows of a minibatch whose longest row has ``width``
tokens it is ``rows x width x per_token + max(head, transients) + fixed``:

- ``per_token``: the bytes the forward leaves alive for its backward, per padded token, *measured*
  on a probe forward (no backward; the graph is dropped) of ``PROBE_ROWS`` rows in the trainer's own
  layout, precision and checkpointing, with gradients on: every storage an operation of that forward
  creates and that is still alive when it returns is counted once (a ``TorchDispatchMode`` keeps a
  weak reference to each): the saved activations, and what the forward keeps outside the graph, such
  as the copies of a shared prompt's KV cache (:mod:`~rlvr.backends.train.shared_prefix`). The probe
  takes the minibatch's longest row and a row that shares its prompt (attention's share of a token
  grows with the row's length); a minibatch whose rows are a quarter longer than the probe's is
  probed again. Where the process's peak RSS can be read (a CPU model in one process, on Linux), a
  forward and backward of the probe rows is measured too (the kernel's high-water mark, reset first,
  after one such pass that pays the first backward's one-time costs), and whatever it rose by beyond
  the count below is added, per token: the allocator's slack and the kernels' own buffers.
- ``transients``: what the backward makes beside them, per token, two layers' worth of the
  forward's activations (one layer's gradients; under checkpointing, one layer's activations
  rebuilt), ``2 x full / layers``, where ``full`` is the probe's count with checkpointing paused
  (the same count when it is off); a step that scores the batch under the frozen reference too
  (``kl_coef > 0``) runs that forward while the policy's graph is alive: one layer's worth more.
- ``head``: the output head's chunk buffers (:mod:`~rlvr.backends.model.head`: ``HEAD_CHUNK_BUFFERS``
  float32 ``[positions, vocabulary]`` blocks of at most ``HEAD_CHUNK_ELEMENTS``), alive at the end of
  the forward (and, when the head trains, at the start of the backward), not beside the transients.
- ``fixed``: the trainable parameters' gradients (freed between steps), before the first optimizer
  step AdamW's two moments, and in a step that probed, what the probe's first backward left resident.
- The budget, read at every minibatch: ``frac`` of the memory free now. CUDA: the device's free
  memory plus what this process's caching allocator holds unused. CPU: ``MemAvailable`` less the
  memory watchdog's floor (``floor_frac`` of ``MemTotal``), so the train step alone never takes
  the run to the point where the watchdog stops it.

The estimate counts live tensors. On CPU that is the RSS only while glibc gives freed blocks back
(:mod:`~rlvr.backends.train.heap`, which the trainer turns on with ``"auto"`` unless told not to):
by default its heap keeps several times the live tensors.

``rows`` is the most that fit, clamped to ``[1, n]``; a prompt shared by a group is read once, so the
estimate, counted on padded rows, errs on the side of memory. The chosen size is reported per step
(``train/micro_batch``).

``micro_batch_tokens`` caps each micro-batch by tokens as well (verl's ``ppo_max_token_len_per_gpu``):
:func:`cut_micro_batches` cuts a rank's share into contiguous micro-batches, in order, each of at most
the rows above and at most that many tokens the forward reads (packed: the rows' real tokens; padded:
rows x the longest). A row longer than the cap alone is refused, naming it. Cutting changes no number
beyond float rounding: each loss component is divided by its count over the whole minibatch.

A backend module: imports torch; reads ``/proc/meminfo`` through :mod:`rlvr.run.watchdog`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from rlvr.backends.model.head import HEAD_CHUNK_ELEMENTS
from rlvr.backends.train.checkpointing import checkpointing_paused, is_checkpointed
from rlvr.errors import BackendError
from rlvr.run.watchdog import meminfo_mb
from rlvr.types import Rollout

DEFAULT_BUDGET_FRAC = 0.25  # of the memory free when a minibatch is sized: a shared machine keeps the rest
PROBE_ROWS = 2
HEAD_CHUNK_BUFFERS = 4  # logits, probabilities and two products of one chunk at a time, float32
REPROBE_GROWTH = 1.25  # a minibatch this much wider than the probe is probed again


@dataclasses.dataclass(frozen=True, slots=True)
class MemoryEstimate:
    """What a sizing decision rests on, in bytes (its figures go to the step's metrics and the log):
    ``per_token`` (kept for the backward), ``transient`` (the backward's, per token), ``head_per_token``
    (the head's chunk buffers, up to ``head_cap``), ``fixed``, the ``budget``, ``width`` and ``rows``."""

    per_token: float
    transient: float
    head_per_token: float
    head_cap: float
    fixed: float
    budget: float
    width: int
    rows: int

    def bytes_for(self, rows: int) -> float:
        tokens = rows * self.width
        head = min(self.head_cap, tokens * self.head_per_token)
        return tokens * self.per_token + max(head, tokens * self.transient) + self.fixed

    @property
    def total(self) -> float:
        return self.bytes_for(self.rows)

    def metrics(self) -> dict[str, float]:
        gib = 2.0**30
        return {"train/memory_budget_gib": self.budget / gib, "train/memory_estimate_gib": self.total / gib}

    def line(self) -> str:
        return (f"train.micro_batch auto: {self.rows} rows of <= {self.width} tokens, estimated "
                f"{self.total / 2**30:.2f} GiB of a {self.budget / 2**30:.2f} GiB budget "
                f"({(self.per_token + self.transient) / 2**10:.0f} KiB a token)")


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
        self.per_token: float | None = None  # kept for the backward, per token (the probe's)
        self.transient = 0.0  # the backward's own, per token (the probe's)
        self.probed_width = 0
        self.one_time = 0.0  # what probing left resident, counted in the estimate of the step that probed
        self.last: MemoryEstimate | None = None
        self.logged_rows = 0

    def rows(self, rollouts: Sequence[Rollout], model: Any, optimizer: torch.optim.Optimizer,
             probe: Callable[[Sequence[Rollout]], Any], *, reference: bool = False) -> int:
        """The micro-batch size for ``rollouts`` (one minibatch) now; ``probe(rows)`` runs the trainer's
        forward over a few rows with gradients on; ``reference``: the step also scores the rows under
        the frozen reference while the policy's graph is alive."""
        if not rollouts:
            return 1
        width = max(_width(r) for r in rollouts)
        if self.per_token is None or width > REPROBE_GROWTH * self.probed_width:
            rows = probe_rows(rollouts)
            self.per_token, self.transient, settled = measure_per_token(model, rows, probe, reference=reference)
            self.one_time += settled  # paid within the step that probed
            self.probed_width = max(_width(r) for r in rows)
        head_per_token, head_cap = head_bytes(model)
        budget = self.budget_frac * free_bytes(self.device, self.floor_frac)
        estimate = MemoryEstimate(self.per_token, self.transient, head_per_token, head_cap,
                                  fixed_bytes(model, optimizer) + self.one_time, budget, width, 1)
        self.one_time = 0.0
        low, high = 1, len(rollouts)  # the most rows that fit, at least one
        while low < high:
            mid = (low + high + 1) // 2
            low, high = (mid, high) if estimate.bytes_for(mid) <= budget else (low, mid - 1)
        self.last = estimate = dataclasses.replace(estimate, rows=low)
        if self.log is not None and abs(low - self.logged_rows) * 4 >= max(1, self.logged_rows):
            self.log(estimate.line())
            self.logged_rows = low
        return low


def probe_rows(rollouts: Sequence[Rollout]) -> list[Rollout]:
    """The minibatch's longest row and, where one exists, the longest other row with its prompt (the
    layout a group's rows are read in), else the next longest: ``PROBE_ROWS`` rows."""
    ranked = sorted(rollouts, key=_width, reverse=True)
    first = ranked[0]
    partners = [r for r in ranked[1:] if r.prompt_ids == first.prompt_ids] or ranked[1:]
    return [first, *partners[:PROBE_ROWS - 1]]


def measure_per_token(model: Any, rows: Sequence[Rollout], probe: Callable[[Sequence[Rollout]], Any], *,
                      reference: bool = False) -> tuple[float, float, float]:
    """Bytes per padded token the forward leaves for its backward, the backward's transients per token
    (see the module docstring), from a probe forward over ``rows``; where the process's peak RSS can be
    read, the first raised by what a forward and backward of ``rows`` took beyond that count, and the
    bytes the first such pass left resident (the first backward's one-time cost: code, lazily made
    buffers), else 0."""
    tokens = len(rows) * max(_width(r) for r in rows)
    measurable = rss_measurable(model)
    settled = 0.0
    if measurable:  # the first backward's one-time work, left out of the measure below and charged once
        start = _status_bytes("VmRSS") or 0
        rss_growth(model, lambda: probe(rows))
        settled = max(0.0, float((_status_bytes("VmRSS") or 0) - start))
    kept = live_bytes(model, lambda: probe(rows))
    full = kept
    if is_checkpointed(model):
        with checkpointing_paused(model):
            full = live_bytes(model, lambda: probe(rows))
    transient = (2 + int(reference)) * full / _layers(model) / tokens
    per_token = kept / tokens
    grown = rss_growth(model, lambda: probe(rows)) if measurable else None
    if grown is not None:  # what the count misses (allocator slack, kernels' own buffers), charged per token
        head_per_token, head_cap = head_bytes(model)
        counted = tokens * per_token + max(min(head_cap, tokens * head_per_token), tokens * transient)
        per_token += max(0.0, grown - counted) / tokens
    return per_token, transient, settled


def rss_measurable(model: Any) -> bool:
    """Whether a probe's peak RSS can be measured here: a CPU model in one process, on Linux."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return False  # a probe's backward would run collectives the other ranks do not
    parameter = next(iter(model.parameters()), None)
    return parameter is not None and parameter.device.type == "cpu" and _status_bytes("VmHWM") is not None


def rss_growth(model: Any, forward: Callable[[], Any]) -> float | None:
    """How far the process's RSS rose above where it stood, at its peak, over ``forward()`` and a backward
    of its result's sum (the kernel's high-water mark, reset first); the gradients it made are dropped.
    ``None`` where the mark cannot be reset."""
    before = _status_bytes("VmRSS")
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return None
    with torch.enable_grad():
        out = forward()
        first = out[0] if isinstance(out, tuple) else out
        first.sum().backward()
    del out, first
    peak = _status_bytes("VmHWM")
    for parameter in model.parameters():
        parameter.grad = None
    return None if peak is None or before is None else float(peak - before)


def _status_bytes(field: str) -> int | None:
    try:
        lines = Path("/proc/self/status").read_text().splitlines()
    except OSError:
        return None
    return next((int(line.split()[1]) * 1024 for line in lines if line.startswith(field + ":")), None)


class _Allocations(TorchDispatchMode):
    """Every storage an operation creates while active, by address, with a weak reference to it."""

    def __init__(self, known: set[int]):
        super().__init__()
        self.known = known
        self.made: dict[int, tuple[StorageWeakRef, int]] = {}  # address -> (storage, bytes)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for tensor in tree_leaves(out):
            # plain tensors only: a wrapper subclass (a sharded DTensor) has no storage of its own
            if type(tensor) in (torch.Tensor, torch.nn.Parameter) and tensor.device.type != "meta":
                storage = tensor.untyped_storage()
                address = storage.data_ptr()
                seen = self.made.get(address)
                if address not in self.known and (seen is None or seen[0].expired()):
                    self.made[address] = (StorageWeakRef(storage), storage.nbytes())
        return out


def live_bytes(model: Any, forward: Callable[[], Any]) -> int:
    """Bytes of the storages ``forward()`` creates (parameters and buffers excepted) that are alive when
    it returns, with its result held: what the backward starts from."""
    known = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    with torch.enable_grad(), _Allocations(known) as made:
        out = forward()
    alive = sum(size for ref, size in made.made.values() if not ref.expired())
    del out  # the graph goes unused
    return alive


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


def head_bytes(model: Any) -> tuple[float, float]:
    """The output head's chunk buffers: bytes per scored token, and at most (one chunk's)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    vocab = weight.shape[0] if weight is not None else HEAD_CHUNK_ELEMENTS
    return HEAD_CHUNK_BUFFERS * vocab * 4.0, HEAD_CHUNK_BUFFERS * HEAD_CHUNK_ELEMENTS * 4.0


def fixed_bytes(model: Any, optimizer: torch.optim.Optimizer) -> float:
    """The trainable gradients, and AdamW's moments when not yet allocated."""
    trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    moments = 0 if optimizer.state else 2 * trainable
    return trainable + moments


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


def _width(rollout: Rollout) -> int:
    return len(rollout.prompt_ids) + len(rollout.completion_ids)


def _layers(model: Any) -> int:
    config: Any = getattr(model, "config", None)
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
