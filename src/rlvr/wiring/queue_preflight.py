"""The queue's three-way pre-flight: a queued run starts only if the budget allows it, its memory
envelope fits the machine, and the engines it needs are present; otherwise it is deferred, cleanly,
with the reason recorded in its entry (``rlvr.cli.queue``).

- **Budget**: the hours of runs started today plus this run's expected length (the wall time of the
  most similar earlier run's record, when there is one) within ``--max-hours-per-day``.
- **Memory envelope**: the run's peak memory, measured (``mem/process_peak_mb`` of the most similar
  earlier run with the same base and the same sampler placement, :func:`~rlvr.record.history.sampler_placement`:
  an identical config if there is one, else the fewest differences; a run whose sampler ran
  elsewhere measured another process's share, so its peak is never borrowed), or else estimated
  from the model's size (:func:`estimate_peak_mb`), must fit in the memory
  available now (``MemAvailable``) less the watchdog's floor (``watchdog.floor_available_frac`` of
  the total), so the run would not be stopped by the watchdog it starts with.
- **Engines**: the Python packages the run imports (torch, transformers, peft), vLLM's interpreter
  for ``sampler.backend = "vllm"`` that rlvr starts, Ray for ``cluster.backend = "ray"``, and a GPU
  (``nvidia-smi -L``) for ``model.device = "cuda..."``.

Part of the composition root: reads run configs through :mod:`rlvr.config.run` and earlier runs
through :mod:`rlvr.record.history`; imports vLLM's finder (and so torch) only for a vLLM run.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr.record.history import RunSummary, base_of, config_differences, find_runs, sampler_placement

MB = 2**20
RUNTIME_MB = 900.0  # a training process before its model: Python, torch, transformers (tiny runs peak near it)
SERVER_RUNTIME_MB = 600.0  # an `rlvr serve` process before its model
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
MARGIN = 1.25  # an estimate is rough: asked for with a quarter on top


@dataclass(frozen=True)
class Machine:
    """What the machine has now: memory (``/proc/meminfo``), installed packages, a GPU."""

    available_mb: float | None
    total_mb: float | None
    has_package: Callable[[str], bool] = lambda name: importlib.util.find_spec(name) is not None
    has_gpu: Callable[[], bool] = lambda: _nvidia_gpu()

    @classmethod
    def now(cls) -> Machine:
        info = _meminfo()
        return cls(info.get("MemAvailable"), info.get("MemTotal"))


def _meminfo() -> dict[str, float]:
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[name] = int(parts[0]) / 1024  # kB → MiB
    return out


def _nvidia_gpu() -> bool:
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return False
    try:
        return subprocess.run([tool, "-L"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@dataclass(frozen=True)
class Verdict:
    """The pre-flight's answer for one run: go, or the reason it waits; every check's reading."""

    go: bool
    reason: str | None
    checks: dict[str, str] = field(default_factory=dict)
    peak_mb: float | None = None
    peak_basis: str | None = None  # "measured in <run>" or "estimated"

    def as_dict(self) -> dict[str, Any]:
        return {"go": self.go, "reason": self.reason, "checks": dict(self.checks), "peak_mb": self.peak_mb,
                "peak_basis": self.peak_basis}


def most_similar(runs: Iterable[RunSummary], config: dict[str, Any], *, same_base: bool = True) -> RunSummary | None:
    """The earlier run whose config differs least from ``config`` (same base when asked), finished ones first."""
    base = base_of(config)
    scored = [(not r.status.startswith("finished"), len(config_differences(config, r.config)), -(r.created_at or 0), r)
              for r in runs if not same_base or r.base == base]
    return min(scored, key=lambda s: s[:3])[3] if scored else None


# ---- the memory envelope ---------------------------------------------------------------------
def model_params(cfg: Any) -> float | None:
    """Parameters of the run's base: the tiny model's from its shape, else from its ``config.json``."""
    m = cfg.model
    if m.tiny:
        vocab, h, inter = 128, m.hidden, 4 * m.hidden  # the character tokenizer has about 100 tokens
        return vocab * h + m.layers * (4 * h * h + 3 * h * inter)
    found = _config_json(str(m.base))
    if found is None:
        return None
    width, depth, words = found.get("hidden_size"), found.get("num_hidden_layers"), found.get("vocab_size")
    if not (isinstance(width, int) and isinstance(depth, int) and isinstance(words, int)):
        return None
    mlp = int(found.get("intermediate_size") or 4 * width)
    heads_out = words * width * (1 if found.get("tie_word_embeddings", True) else 2)
    return heads_out + depth * (4 * width * width + 3 * width * mlp)


def _config_json(base: str) -> dict[str, Any] | None:
    candidates = [Path(base).expanduser() / "config.json"]
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(base, "config.json")
        if isinstance(cached, str):
            candidates.append(Path(cached))
    except Exception:  # noqa: BLE001 - no hub client or an odd name: only local folders count
        pass
    for path in candidates:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    return None


def estimate_peak_mb(cfg: Any) -> float | None:
    """A rough peak for the run's processes on this machine, ``None`` when the model's size is unknown:

    ``(RUNTIME + W * (1 + trainer + replica + reference) + servers * (SERVER_RUNTIME + W)) * MARGIN``
    with ``W`` the weights in ``model.dtype``; ``trainer`` 3 for a full fine-tune (gradients and
    AdamW's two moments, in float32 terms) and 0.05 for LoRA; ``replica`` 1 when the in-process
    engine samples from its own copy (off-policy, ``max_head_offpolicy_versions > 0``) or vLLM's
    engine runs in the training process (``vllm_colocate``); ``reference``
    1 for a full fine-tune's frozen KL reference (``kl_coef > 0``); ``servers`` the ``rlvr serve``
    replicas rlvr starts beside the trainer (vLLM reserves its own cache on top, not counted)."""
    params = model_params(cfg)
    if params is None:
        return None
    weights = params * DTYPE_BYTES[cfg.model.dtype] / MB
    lora = cfg.loop.lora_rank > 0
    trainer = 0.05 if lora else 3.0 * 4 / DTYPE_BYTES[cfg.model.dtype]
    colocated = cfg.sampler.backend == "vllm_colocate"  # vLLM's engine holds its own copy in this process
    replica = 1.0 if colocated or (cfg.sampler.backend == "in_process" and cfg.loop.max_head_offpolicy_versions > 0) \
        else 0.0
    reference = 1.0 if not lora and cfg.loop.kl_coef > 0 else 0.0
    s = cfg.sampler
    servers = s.replicas if s.backend == "http" and s.url is None else 0
    trainer_mb = RUNTIME_MB + weights * (1 + trainer + replica + reference)
    return (trainer_mb + servers * (SERVER_RUNTIME_MB + weights)) * MARGIN


def memory_check(cfg: Any, similar: RunSummary | None, machine: Machine) -> tuple[str | None, str, float | None, str]:
    """``(reason to wait or None, reading, peak, basis)``."""
    peak: float | None
    if similar is not None and similar.peak_mb is not None:
        peak, basis = similar.peak_mb, f"measured in {similar.path}"
    else:
        peak, basis = estimate_peak_mb(cfg), "estimated from the model's size"
    if peak is None:
        return None, "the model's size is unknown and no earlier run measured it: not checked", None, "unknown"
    if machine.available_mb is None:
        return None, f"needs ~{peak:.0f} MB ({basis}); this machine does not say what it has", peak, basis
    floor = (cfg.watchdog.floor_available_frac or 0.0) * (machine.total_mb or 0.0) if cfg.watchdog.enabled else 0.0
    room = machine.available_mb - floor
    reading = f"needs ~{peak:.0f} MB ({basis}); {machine.available_mb:.0f} MB available, {floor:.0f} MB kept free"
    if peak > room:
        return f"memory: the run needs ~{peak:.0f} MB ({basis}) but {room:.0f} MB are free beyond the watchdog's " \
               f"floor", reading, peak, basis
    return None, reading, peak, basis


# ---- engines -----------------------------------------------------------------------------------
def engines_check(cfg: Any, machine: Machine) -> tuple[str | None, str]:
    """``(reason to wait or None, reading)``: every engine the run needs, named."""
    needed = [("torch", "the trainer"), ("transformers", "the model"), ("peft", "LoRA")]
    if cfg.cluster.backend == "ray":
        needed.append(("ray", "cluster.backend = 'ray'"))
    missing = [f"{name} (for {why})" for name, why in needed if not machine.has_package(name)]
    if cfg.sampler.backend == "vllm" and cfg.sampler.url is None and cfg.sampler.serve_command is None:
        problem = _vllm_missing(cfg.sampler.vllm_python)
        if problem:
            missing.append(f"vLLM (for sampler.backend = 'vllm': {problem})")
    if cfg.sampler.backend == "sglang" and cfg.sampler.url is None and cfg.sampler.serve_command is None:
        problem = _sglang_missing(cfg.sampler.sglang_python)
        if problem:
            missing.append(f"SGLang (for sampler.backend = 'sglang': {problem})")
    if cfg.sampler.backend == "vllm_colocate" and not machine.has_package("vllm"):
        missing.append("vllm (for sampler.backend = 'vllm_colocate': inside this Python, the one rlvr runs from)")
    if str(cfg.model.device).startswith("cuda") and not machine.has_gpu():
        missing.append(f"a GPU (for model.device = {cfg.model.device!r}: nvidia-smi lists none)")
    names = [n for n, _ in needed] + (["vllm"] if cfg.sampler.backend in ("vllm", "vllm_colocate") else [])
    if missing:
        return f"engines: missing {', '.join(missing)}", f"missing {', '.join(missing)}"
    return None, f"present: {', '.join(names)}"


def _sglang_missing(explicit: str | None) -> str | None:
    try:
        from rlvr.backends.serve.sglang import find_sglang_python

        find_sglang_python(explicit)
    except Exception as exc:  # noqa: BLE001 - a missing engine is the answer, not a crash
        return str(exc).splitlines()[0]
    return None


def _vllm_missing(explicit: str | None) -> str | None:
    try:
        from rlvr.backends.serve.vllm import find_vllm_python

        python = find_vllm_python(explicit)
    except Exception as exc:  # noqa: BLE001 - a missing extra or engine is the answer, not a crash
        return str(exc).splitlines()[0]
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    try:
        found = subprocess.run([python, "-c", probe], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{python} cannot be run ({exc})"
    return None if found else f"{python} has no vllm package"


# ---- the three together ------------------------------------------------------------------------
def budget_check(used_s: float, max_hours_per_day: float | None, similar: RunSummary | None) -> tuple[str | None, str]:
    expected = similar.wall_s if similar is not None else None
    like = f"as {similar.path}" if similar is not None else ""
    said = f"{used_s / 3600:.2f} h used today" + (f", ~{expected / 3600:.2f} h expected ({like})" if expected else "")
    if max_hours_per_day is None:
        return None, said + "; no daily limit"
    left = max_hours_per_day * 3600 - used_s
    if left <= 0:
        return f"budget: {used_s / 3600:.2f} h of runs today reached --max-hours-per-day {max_hours_per_day}", said
    if expected and expected > left:
        return (f"budget: the run is expected to take ~{expected / 3600:.2f} h ({like} did) and "
                f"{left / 3600:.2f} h are left today (--max-hours-per-day {max_hours_per_day})"), said
    return None, said + f"; {left / 3600:.2f} h left"


def preflight(cfg: Any, runs: list[RunSummary], *, used_s: float, max_hours_per_day: float | None,
              machine: Machine) -> Verdict:
    """Budget ∧ memory ∧ engines for a run of config ``cfg`` (a :class:`~rlvr.config.run.RunConfig`);
    ``runs`` are the earlier runs its figures may come from."""
    config = cfg.model_dump(mode="json")
    similar = most_similar(runs, config)
    placement = sampler_placement(config)
    alike = most_similar([r for r in runs if placement is not None and sampler_placement(r.config) == placement],
                         config)
    reasons, checks = [], {}
    budget_reason, checks["budget"] = budget_check(used_s, max_hours_per_day, similar)
    memory_reason, checks["memory"], peak, basis = memory_check(cfg, alike, machine)
    engines_reason, checks["engines"] = engines_check(cfg, machine)
    reasons = [r for r in (budget_reason, memory_reason, engines_reason) if r]
    return Verdict(not reasons, "; ".join(reasons) or None, checks, peak, basis)


def earlier_runs(folders: Iterable[Path]) -> list[RunSummary]:
    """Every run under each of ``folders`` (each read once)."""
    seen: dict[Path, RunSummary] = {}
    for folder in {f.resolve() for f in folders if f.is_dir()}:
        for run in find_runs(folder):
            seen.setdefault(run.path.resolve(), run)
    return sorted(seen.values(), key=lambda r: (r.created_at or 0.0, str(r.path)))
