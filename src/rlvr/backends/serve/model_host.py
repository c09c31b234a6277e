"""The model behind ``rlvr serve``: one base model, named LoRA adapters, versions, and batching.

:class:`ModelHost` owns the weights, the :class:`~rlvr.backends.sample.engine.InProcessEngine` whose
worker thread generates for every client, the :class:`~rlvr.backends.serve.scheduler.Scheduler`
that interleaves the requests' decode steps (one batch per adapter), and the render pool
(:mod:`~rlvr.backends.serve.render`). Model changes (adapter load/unload, weight reload) wait for
the rows already started and run with nothing in flight, so no completion mixes weights and each
answer carries the policy version that produced it. Prompt log-probs
(:meth:`ModelHost.generate_scored`) are jobs of the same turns, scored by the engine's forward
pass, so they too never race a weight change. An unloaded adapter's PEFT slot
is kept (up to ``MAX_FREE_SLOTS``) and refilled in place by the next adapter of the same config, so
a hot-load per version costs a tensor copy, not a rebuild of the LoRA layers. :class:`RequestError`
is how it refuses a request, in vLLM's error shape.

A backend module: imports torch, transformers and peft.
"""

from __future__ import annotations

import asyncio
import json
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from fastapi.responses import JSONResponse
from peft import PeftModel
from safetensors import safe_open
from safetensors.torch import load_file

from rlvr.backends.model.io import load_model, load_tokenizer
from rlvr.backends.sample.engine import InProcessEngine
from rlvr.backends.serve.policy import ServerPolicy
from rlvr.backends.serve.render import RenderPool
from rlvr.backends.serve.scheduler import Job, Scheduler
from rlvr.backends.sync.lanes import VERSION_FILE, read_policy_version
from rlvr.errors import RequestError
from rlvr.types import Completion, SamplingParams

__all__ = ["ModelHost", "ServerPolicy", "error_response"]

_DEFAULT = "__rlvr_default__"  # the adapter given with --adapter: part of the served model


ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 403: "PermissionDeniedError", 404: "NotFoundError",
               408: "RequestTimeoutError", 413: "RequestTooLargeError", 429: "RateLimitError",
               500: "InternalServerError"}


def _encodable(text: str | None) -> str | None:
    """``text`` with anything UTF-8 cannot carry (a lone surrogate from the request) escaped."""
    return None if text is None else text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_response(exc: RequestError) -> JSONResponse:
    """A refused request answered as vLLM does: ``{"error": {message, type, param, code}}``."""
    body = {"message": _encodable(exc.message), "type": ERROR_TYPES.get(exc.status, "APIError"),
            "param": _encodable(exc.param), "code": exc.status}
    return JSONResponse({"error": body}, status_code=exc.status)


# ---- the model, its adapters and the batcher ---------------------------------------------------
@dataclass(slots=True)
class _Adapter:
    path: str
    version: int | None
    loaded_at: float
    slot: str  # the PEFT adapter holding its weights


@dataclass(slots=True)
class _Slot:
    """A PEFT adapter in the model: its config (minus paths) and, when known, file key -> parameter."""

    signature: str
    params: dict[str, torch.Tensor] | None


_NOT_STRUCTURAL = {"base_model_name_or_path", "revision", "inference_mode", "peft_version", "auto_mapping"}
MAX_FREE_SLOTS = 2


def _signature(path: str) -> str:
    config = json.loads((Path(path) / "adapter_config.json").read_text())
    return json.dumps({k: v for k, v in config.items() if k not in _NOT_STRUCTURAL}, sort_keys=True, default=str)


class _LiveModel:
    """What the engine generates from: whichever module the host holds now (base or PEFT)."""

    def __init__(self, host: ModelHost):
        self.host = host

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        return self.host.model.parameters()

    def eval(self) -> _LiveModel:
        self.host.model.eval()
        return self

    @property
    def config(self) -> Any:  # what a shared prompt's KV cache is built for (backends/sample/prefix.py)
        return self.host.model.config

    def generate(self, **kwargs: Any) -> Any:
        return self.host.model.generate(**kwargs)

    def __call__(self, **kwargs: Any) -> Any:  # a forward pass, for scoring
        return self.host.model(**kwargs)

    def get_base_model(self) -> Any:  # what token_logprobs inspects for logits_to_keep
        model = self.host.model
        return model.get_base_model() if isinstance(model, PeftModel) else model


class ModelHost:
    """A causal LM, its LoRA adapters and versions, and one engine that batches every request."""

    def __init__(self, model_dir: str | Path, *, adapter: str | Path | None = None, device: str = "cpu",
                 dtype: str = "float32", served_version: int | None = None,
                 served_model_name: str | None = None, max_batch: int = 256, policy: ServerPolicy | None = None):
        self.model_dir, self.device = str(model_dir), device
        self.policy = policy or ServerPolicy()
        self.max_batch = max_batch
        self.name = served_model_name or str(model_dir)
        self.tokenizer = load_tokenizer(self.model_dir)
        self.model: Any = load_model(self.model_dir, dtype=dtype, device=device)
        config = self.model.config
        self.vocab_size = int(config.vocab_size)
        self.max_len = int(getattr(config, "max_position_embeddings", 0) or 1 << 30)
        eos = self.model.generation_config.eos_token_id
        self.eos_ids = {i for i in (eos if isinstance(eos, (list, tuple)) else [eos]) if i is not None}
        self.eos_ids.add(self.tokenizer.eos_token_id)
        self.adapters: dict[str, _Adapter] = {}
        self._slots: dict[str, _Slot] = {}
        self._free: list[str] = []  # slots of unloaded adapters, refilled in place by the next alike
        self._next_slot = 0
        self.base_adapter = str(adapter) if adapter else None
        if adapter:
            self._load(_DEFAULT, str(adapter))
        folder_version = read_policy_version(adapter or model_dir)
        self.base_version = served_version if served_version is not None else (folder_version or 0)
        self._current: int | None = self.base_version
        self.engine = InProcessEngine(_LiveModel(self), eos_ids=self.eos_ids, pad_id=self.tokenizer.pad_token_id,
                                      version=lambda: self._current, max_batch=max_batch, name="rlvr-serve")
        self.scheduler = Scheduler(self, max_batch=max_batch)
        self.renderer = RenderPool(self.tokenizer, self.policy.render)
        self._active: str | None = ""  # the PEFT adapter selected now ("": unknown, select anew)

    # -- versions ---------------------------------------------------------------------------
    def version_of(self, name: str | None) -> int | None:
        return self.base_version if name is None else self.adapters[name].version

    def served_policy_version(self) -> int | None:
        """The newest policy version this server can serve (base or any loaded adapter)."""
        known = [v for v in [self.base_version, *(self.version_of(n) for n in self.public_adapters())]
                 if v is not None]
        return max(known) if known else None

    def public_adapters(self) -> list[str]:
        return [name for name in self.adapters if name != _DEFAULT and "\0" not in name]

    def resolve(self, model: str | None) -> str | None:
        """The adapter a request's ``model`` names (``None``: the served model itself)."""
        if model is None or model == self.name:
            return None
        if model in self.adapters and model != _DEFAULT:
            return model
        raise RequestError(f"The model `{model}` does not exist.", "model", 404)

    # -- generation (rlvr.backends.serve.scheduler) -------------------------------------------
    @property
    def current_version(self) -> int | None:
        return self._current

    async def generate(self, adapter: str | None, jobs: Sequence[tuple[Sequence[int], SamplingParams, int]]
                       ) -> tuple[list[Completion], int | None]:
        """Sample every job (prompt ids, params, seed) with ``adapter``; one policy version for all."""
        outs, _, version = await self.generate_scored(adapter, jobs, ())
        return outs, version

    async def generate_scored(self, adapter: str | None, jobs: Sequence[tuple[Sequence[int], SamplingParams, int]],
                              prompts: Sequence[Sequence[int]], *, top_n: int = 0
                              ) -> tuple[list[Completion], list[tuple[list[float], list[int]]], int | None]:
        """:meth:`generate`, plus per prompt of ``prompts`` the temperature-1 log-prob and rank of each
        token after the first (vLLM's ``prompt_logprobs``); one policy version for all, ``None`` when
        a weight change fell between two of the turns that answered."""
        made = self.submit(adapter, list(jobs) + [(p, None, 0) for p in prompts], top_n=top_n)
        outs = await self.wait(made)
        versions = {v for _, v in outs}
        return ([c for c, _ in outs[:len(jobs)]], [s for s, _ in outs[len(jobs):]],
                versions.pop() if len(versions) == 1 else None)

    def submit(self, adapter: str | None, jobs: Sequence[tuple[Sequence[int], SamplingParams | None, int]], *,
               top_n: int = 0, listener: Any = None) -> list[Job]:
        return self.scheduler.submit(adapter, jobs, top_n=top_n, listener=listener)

    @staticmethod
    async def wait(jobs: Sequence[Job]) -> list[Any]:
        """Every job's result; the jobs are cancelled if the caller is (its client went away)."""
        try:
            return list(await asyncio.gather(*(j.future for j in jobs)))
        finally:
            for job in jobs:
                job.cancelled = True

    def select(self, adapter: str | None) -> None:
        if adapter is not None and adapter not in self.adapters:
            raise RequestError(f"The model `{adapter}` was unloaded before its requests ran.", "model", 404)
        self._select(adapter)

    def _select(self, adapter: str | None) -> None:
        """Point the model at ``adapter``; only ever called with no batch in flight."""
        self._current = self.version_of(adapter)
        if not isinstance(self.model, PeftModel):
            return
        active = self.adapters[adapter].slot if adapter else (_DEFAULT if self.base_adapter else None)
        if active == self._active:
            return
        self._active = active
        layers: Any = self.model.base_model  # the LoRA model under the PEFT wrapper
        if active is None:
            layers.disable_adapter_layers()
        else:
            layers.enable_adapter_layers()
            self.model.set_adapter(active)

    # -- model changes (under the lock, off the event loop) ----------------------------------------
    async def load_adapter(self, name: str, path: str, version: int | None, replace: bool = False) -> None:
        if name == self.name or name == _DEFAULT:
            raise RequestError(f"The lora adapter name '{name}' is the served model's name.", "lora_name")
        if name in self.adapters and not replace:
            raise RequestError(f"The lora adapter '{name}' has already been loaded.", "lora_name")
        self._check_allowed(path, "lora_path")
        if not (Path(path) / "adapter_config.json").is_file():
            raise RequestError(f"No adapter_config.json under lora_path {path!r}.", "lora_path")
        version = version if version is not None else read_policy_version(path)
        async with self.scheduler.paused():
            self._active = ""
            await asyncio.to_thread(self._swap, name, path, version)

    def _check_allowed(self, path: str, field: str) -> None:
        # One answer for every path outside: nothing about what exists there is told.
        if not self.policy.allows(path):
            raise RequestError(f"{field} is outside the folders this server loads from (rlvr serve --allowed-dir); "
                               "nothing was read", field, 403)

    def _swap(self, name: str, path: str, version: int | None) -> None:
        """Load ``path`` as ``name``; an adapter already under that name is replaced only once the
        new one has loaded, so a failed in-place reload leaves the old one serving."""
        staging = f"{name}\0staging"
        try:
            self._load(staging, path)
        except Exception as exc:  # noqa: BLE001 - any failure to load is the request's
            raise RequestError(f"Loading the lora adapter from {path!r} failed: {exc}", "lora_path") from exc
        if name in self.adapters:
            self._unload(name)
        self.adapters[name] = self.adapters.pop(staging)
        self.adapters[name].version = version

    def _load(self, name: str, path: str) -> None:
        """Load an adapter; into a free slot of the same shape when there is one (a tensor copy,
        the common case when versions replace each other), else as a new PEFT adapter."""
        signature = _signature(path)
        for slot in [f for f in self._free if self._slots[f].signature == signature]:
            self._free.remove(slot)
            try:
                refilled = self._refill(slot, path)
            except Exception:
                self._drop(slot)
                raise
            if refilled:
                self.adapters[name] = _Adapter(path, None, time.time(), slot)
                return
            self._drop(slot)
        slot = _DEFAULT if name == _DEFAULT else f"slot{self._next_slot}"
        self._next_slot += 1
        if isinstance(self.model, PeftModel):
            self.model.load_adapter(path, adapter_name=slot, is_trainable=False, torch_device=self.device)
        else:
            self.model = PeftModel.from_pretrained(self.model, path, adapter_name=slot, is_trainable=False,
                                                   torch_device=self.device)
        self.model.eval()
        self._slots[slot] = _Slot(signature, self._slot_params(slot, path))
        self.adapters[name] = _Adapter(path, None, time.time(), slot)

    def _slot_params(self, slot: str, path: str) -> dict[str, torch.Tensor] | None:
        """Where each tensor of the adapter file lives in the model (PEFT inserts the adapter name
        before the leaf); ``None`` when that cannot be told, and the slot is then never refilled."""
        file = Path(path) / "adapter_model.safetensors"
        if not file.is_file():
            return None
        with safe_open(str(file), "pt") as f:
            keys = list(f.keys())
        params = dict(self.model.named_parameters())
        found = {}
        for key in keys:
            head, _, leaf = key.rpartition(".")
            param = params.get(f"{head}.{slot}.{leaf}")
            if param is None:
                param = params.get(f"{key}.{slot}")
            if param is None:
                return None
            found[key] = param
        return found

    def _refill(self, slot: str, path: str) -> bool:
        params = self._slots[slot].params
        state = load_file(str(Path(path) / "adapter_model.safetensors"))
        if params is None or state.keys() != params.keys() or any(
                state[k].shape != params[k].shape for k in state):
            return False
        with torch.no_grad():
            for key, tensor in state.items():
                params[key].copy_(tensor)
        return True

    async def unload_adapter(self, name: str) -> None:
        if name not in self.adapters or name == _DEFAULT:
            raise RequestError(f"The lora adapter '{name}' cannot be found.", "lora_name", 404)
        async with self.scheduler.paused():
            self._active = ""
            await asyncio.to_thread(self._unload, name)

    def _unload(self, name: str) -> None:
        slot = self.adapters.pop(name).slot
        if self._slots[slot].params is not None and len(self._free) < MAX_FREE_SLOTS:
            self._free.append(slot)  # kept for the next adapter of the same shape
        else:
            self._drop(slot)

    def _drop(self, slot: str) -> None:
        del self._slots[slot]
        if self._slots:
            with warnings.catch_warnings():  # "active adapter deleted": every batch selects its own anyway
                warnings.simplefilter("ignore")
                self.model.delete_adapter(slot)
        else:  # PEFT cannot run with no adapter at all: take the LoRA layers out again
            self.model = self.model.unload()

    async def reload_weights(self, path: str, version: int | None) -> int:
        """Load full weights (safetensors, HF names) from ``path`` into the base model."""
        self._check_allowed(path, "path")
        files = sorted(Path(path).glob("*.safetensors")) if Path(path).is_dir() else [Path(path)]
        if not files or not all(f.is_file() for f in files):
            raise RequestError(f"No safetensors weights at path {path!r}.", "path")
        version = version if version is not None else read_policy_version(path if Path(path).is_dir()
                                                                           else Path(path).parent)
        if version is None:
            raise RequestError(f"No policy_version given and no {VERSION_FILE} at {path!r}.", "policy_version")
        async with self.scheduler.paused():
            count = await asyncio.to_thread(self._copy_weights, files)
            self.base_version = version
        return count

    def _copy_weights(self, files: list[Path]) -> int:
        base = self.model.get_base_model() if isinstance(self.model, PeftModel) else self.model
        params = dict(base.named_parameters())
        state: dict[str, torch.Tensor] = {}
        for f in files:
            try:
                state.update(load_file(str(f)))
            except Exception as exc:  # noqa: BLE001 - safetensors' errors: not a weights file
                raise RequestError(f"{f.name} is not a safetensors weights file ({exc})", "path") from None
        targets = {}
        for name, tensor in state.items():
            head, _, leaf = name.rpartition(".")
            target = params.get(name)
            if target is None:  # a layer wrapped by LoRA keeps its weight under base_layer
                target = params.get(f"{head}.base_layer.{leaf}")
            if target is None:
                raise RequestError(f"weights at path name parameter {name!r}, which the model does not have", "path")
            if target.shape != tensor.shape:
                raise RequestError(f"parameter {name!r}: shape {list(tensor.shape)} != {list(target.shape)}", "path")
            targets[name] = target
        with torch.no_grad():
            for name, target in targets.items():
                target.copy_(state[name])
        return len(targets)

    def close(self) -> None:
        self.renderer.close()
        self.engine.close()
