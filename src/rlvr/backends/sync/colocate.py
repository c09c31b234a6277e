"""Weight sync for vLLM inside the training process (:class:`~rlvr.backends.sample.vllm_engine.ColocatedVLLM`).

:class:`ColocateLane` is the run's :data:`~rlvr.protocols.WeightSync`: after each train step it hands
the engine the policy's weights as tensors, in the checkpoint's names, read by vLLM's in-place reload
(no file is written, the engine is not restarted):

- a full fine-tune: every parameter as the trainer holds it;
- LoRA: the base weights with the adapter merged in (``W + scale · B·A`` per adapted layer, computed
  by PEFT's own ``get_delta_weight``), as TRL's colocated mode pushes them; the engine serves a plain
  model, never an adapter, and the trainer's model is left untouched.

Like every lane it checks what is served afterwards: the version the engine holds, and (with
``verify``) the weights themselves: the engine's log-probs of a short probe must match the policy's
own within ``probe_tolerance``, so a reload that did not take cannot pass for one that did.

:class:`SleepWhileTraining` wraps the trainer: the engine sleeps (its KV cache dropped, its weights
offloaded) while each train step runs, and the step's metrics carry the device memory in use awake
and asleep, the sleep and wake times, and the trainer's own peak.

A backend module: imports torch and peft.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import torch
from peft.tuners.lora import LoraLayer

from rlvr.backends.model.io import token_logprobs
from rlvr.errors import BackendError
from rlvr.types import SamplingParams

PROBE_TEXT = "Probe: 12 + 7 ="
PROBE_TOKENS = 4


def merged_weights(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """A PEFT model's weights in its base model's names, each adapted layer's weight with the active
    adapters' delta added (a new tensor; the model is not changed). Adapter tensors are not listed."""
    base = model.get_base_model()
    for name, param in base.named_parameters(remove_duplicate=False):
        if ".lora_" in name:
            continue
        owner, _, leaf = name.rpartition(".base_layer.")
        if not owner:
            yield name, param.detach()
            continue
        layer = base.get_submodule(owner)
        tensor = param.detach()
        if leaf == "weight" and isinstance(layer, LoraLayer) and not layer.merged:
            for adapter in layer.active_adapters:
                if adapter in layer.lora_A or adapter in getattr(layer, "lora_embedding_A", {}):
                    lora: Any = layer  # get_delta_weight is the LoRA layer's subclass's (Linear, Embedding, ...)
                    tensor = tensor + lora.get_delta_weight(adapter).to(tensor.dtype)
        yield f"{owner}.{leaf}", tensor


def policy_weights(policy: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """What the engine must serve for ``policy``: merged LoRA weights, or every parameter."""
    if policy.is_lora:
        return merged_weights(policy.model)
    return ((name, p.detach()) for name, p in policy.model.named_parameters(remove_duplicate=False))


class ColocateLane:
    """``lane(version)``: push the policy's weights into ``engine`` and check it serves them."""

    lane = "vllm_colocate"

    def __init__(self, engine: Any, policy: Any, *, verify: bool = True, probe_tolerance: float | None = None):
        self.engine, self.policy, self.verify = engine, policy, verify
        default = 0.02 if next(policy.model.parameters()).dtype == torch.float32 else 0.2
        self.probe_tolerance = probe_tolerance if probe_tolerance is not None else default
        self.probe = [int(t) for t in policy.tokenizer(PROBE_TEXT)["input_ids"]]
        self.seconds: list[float] = []
        self.probe_gaps: list[float] = []

    def __call__(self, version: int) -> int:
        start = time.perf_counter()
        served = self.engine.publish(lambda: policy_weights(self.policy), version)
        if served != version:
            raise BackendError(f"colocated vLLM serves policy version {served} after publishing version {version}: "
                               "the engine is stale")
        if self.verify:
            self.check_weights(version)
        self.seconds.append(time.perf_counter() - start)
        return served

    def check_weights(self, version: int) -> float:
        """The engine's log-probs of a probe must be the policy's own: the weights moved, not a label."""
        params = SamplingParams(max_tokens=PROBE_TOKENS, temperature=1.0)
        out = self.engine.generate_now(self.probe, params, seed=0)
        model = self.policy.model
        full = torch.tensor([self.probe + list(out.ids)], device=next(model.parameters()).device)
        model.eval()  # as the samplers do: the trainer sets train mode itself at each step
        with torch.no_grad():
            own = token_logprobs(model, full, torch.ones_like(full))[0, len(self.probe) - 1:].float().cpu()
        gap = (own - torch.tensor(out.logprobs, dtype=torch.float32)).abs().max().item()
        self.probe_gaps.append(gap)
        if not gap <= self.probe_tolerance:
            raise BackendError(f"colocated vLLM holds policy version {version} but does not serve its weights: on a "
                               f"probe its log-probs differ from the policy's by {gap:.3g} (tolerance "
                               f"{self.probe_tolerance:g}); the in-memory reload did not take")
        return gap

    def close(self) -> None:
        self.engine.close()

    def describe(self) -> dict[str, Any]:
        engine = getattr(self.engine, "describe", None)
        return {"type": f"{__name__}.{type(self).__name__}", "lane": self.lane, "transport": "in memory",
                "weights": "base + merged LoRA delta" if self.policy.is_lora else "all parameters",
                "verify": self.verify, "probe_tolerance": self.probe_tolerance, "engine": engine() if engine else None}


class SleepWhileTraining:
    """A trainer whose every step runs with ``engine`` asleep; the step's metrics gain ``vllm/*``
    (memory in use awake and asleep, sleep and wake seconds of the last cycle, the trainer's peak)."""

    def __init__(self, trainer: Any, engine: Any):
        self.trainer, self.engine = trainer, engine

    def __call__(self, batch: Any) -> dict[str, Any]:
        woke = {k: v for k, v in self.engine.last_sleep.items() if k == "vllm/wake_s"}  # the last wake's time
        figures = self.engine.sleep()
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        metrics = dict(self.trainer(batch) or {})
        if cuda:
            metrics["vllm/train_peak_allocated_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 3)
        return {**metrics, **woke, **figures}

    def __getattr__(self, name: str) -> Any:
        if name in ("trainer", "engine"):  # not set yet (a copy being made): nothing to delegate to
            raise AttributeError(name)
        return getattr(self.trainer, name)

    def describe(self) -> dict[str, Any]:
        inner = getattr(self.trainer, "describe", None)
        return {**(inner() if inner else {}), "colocated_vllm_sleeps_while_training": True}
