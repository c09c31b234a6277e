"""SGLang's server as a child process, and the admin calls its weight-sync lanes make.

:class:`SGLangServer` starts ``python -m sglang.launch_server`` from the interpreter
:func:`find_sglang_python` picks, on loopback and a free port, serving the model under
``served_model_name``; a LoRA run adds ``--enable-lora --max-lora-rank R`` so adapters can be loaded
at run time. ``serve_command`` replaces the whole command line, as for ``rlvr serve``.

:class:`SGLangApi` holds what differs from ``rlvr serve`` once the server runs (SGLang's native
routes, ``python/sglang/srt/managers/io_struct.py``):

- full weights: ``POST /update_weights_from_disk`` ``{model_path, weight_version, flush_cache: true,
  abort_all_requests: false}`` (in-flight requests finish on the old weights; no KV of the old
  weights is reused), answered ``{success, message}``; the folder holds safetensors in checkpoint
  names, as the disk lane writes them;
- the served version: ``GET /get_weight_version`` (``/model_info`` on newer SGLang), the label the
  last reload set: a label, so the disk lane also compares the served log-probs of a probe
  (:meth:`SGLangApi.probe`, through ``/generate``) with the policy's own;
- adapters: ``POST /load_lora_adapter`` and ``/unload_lora_adapter`` ``{lora_name, lora_path}``;
  SGLang lists loaded adapters on ``/v1/models`` (with their ``root`` folder), where the lane finds
  the versioned name and its ``rlvr_version.json``;
- its software version: ``GET /version``, else ``GET /get_server_info``'s ``version``.

``rlvr serve`` answers all of these (:mod:`rlvr.backends.serve.sglang_routes`), which is how the
lanes are tested on a machine without SGLang.

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

from rlvr.backends.sample.sglang import whole_version
from rlvr.backends.serve.process import ServerProcess
from rlvr.backends.sync.lanes import read_policy_version
from rlvr.errors import BackendError, ConfigError

SGLANG_MODULE = "sglang.launch_server"


def find_sglang_python(explicit: str | None = None) -> str:
    """The interpreter that runs SGLang: ``explicit`` (``sampler.sglang_python``), else
    ``$RLVR_SGLANG_PYTHON``, else this interpreter when it can import sglang."""
    for source, value in (("sampler.sglang_python", explicit),
                          ("RLVR_SGLANG_PYTHON", os.environ.get("RLVR_SGLANG_PYTHON"))):
        if value:
            found = shutil.which(value) or (value if Path(value).is_file() else None)
            if found is None:
                raise ConfigError(f"{source}={value!r} is not an executable Python; point it at the interpreter of "
                                  "the environment SGLang is installed in")
            return found
    if importlib.util.find_spec("sglang") is not None:
        return sys.executable
    raise ConfigError("sampler.backend='sglang' without sampler.url starts SGLang, which is not installed here: "
                      "install it in an environment of its own (pip install sglang, on a CUDA machine) and set "
                      "sampler.sglang_python (or RLVR_SGLANG_PYTHON) to its interpreter, or give sampler.url of a "
                      "running SGLang server")


class SGLangServer(ServerProcess):
    """``with SGLangServer(model_dir, python=..., lora_rank=16) as server: ...``."""

    def __init__(self, model_dir: str | Path, *, python: str, dtype: str = "float32", lora_rank: int = 0,
                 seed: int = 0, sglang_args: Sequence[str] = (), **kwargs: Any):
        kwargs.setdefault("startup_timeout_s", 600.0)
        super().__init__(model_dir, **kwargs)
        self.python, self.dtype, self.lora_rank, self.seed = python, dtype, lora_rank, seed
        self.sglang_args = list(sglang_args)

    @property
    def kind(self) -> str:
        return "SGLang server"

    def args(self) -> list[str]:
        if self.command is not None:
            return super().args()
        args = [self.python, "-m", SGLANG_MODULE, "--model-path", self.model_dir, "--host", self.host,
                "--port", str(self.port), "--dtype", self.dtype, "--random-seed", str(self.seed),
                "--served-model-name", self.model_name]
        if self.adapter:  # requests name SGLang's adapters per request (lora_path), not by the served name
            raise ConfigError("an SGLang server serves a LoRA run's adapters by hot-loading them: use "
                              "sampler.lane = 'lora_hot_load' (auto), not 'kill_restart'")
        if self.lora_rank:
            args += ["--enable-lora", "--max-lora-rank", str(self.lora_rank), "--lora-target-modules", "all"]
        return args + self.sglang_args + self.extra_args


class SGLangApi:
    """The admin calls that differ on an SGLang server; ``admin`` is a
    :class:`~rlvr.backends.sync.lanes.ServerAdmin`. See the module docstring."""

    name = "sglang"
    version_is_a_label = True  # the disk lane checks the weights too (probe)
    lora_routes = ("/load_lora_adapter", "/unload_lora_adapter")

    def info(self, admin: Any) -> dict[str, Any]:
        """``{"version": ...}``: ``/version``, else ``/get_server_info``'s ``version``."""
        response = admin.request("GET", "/version", ok=(200, 404))
        if response.status_code == 200 and isinstance(_json(response).get("version"), str):
            return _json(response)
        found = _json(admin.request("GET", "/get_server_info")).get("version")
        return {"version": found, "server": "sglang"}

    def reload(self, admin: Any, folder: Path, version: int) -> None:
        body = {"model_path": str(folder.resolve()), "weight_version": str(version), "flush_cache": True,
                "abort_all_requests": False}
        response = admin.request("POST", "/update_weights_from_disk", json=body, ok=(200, 400))
        answer = _json(response)
        if response.status_code != 200 or not answer.get("success", False):
            raise BackendError(f"{admin.url}/update_weights_from_disk refused {folder} (version {version}): "
                               f"{answer.get('message', response.text[:300])}")

    def base_version(self, admin: Any, info: Mapping[str, Any], model_name: str) -> int | None:
        """The weight-version label, else the version file of the folder the server loaded."""
        for path in ("/get_weight_version", "/model_info", "/get_model_info"):
            response = admin.request("GET", path, ok=(200, 404))
            body = _json(response) if response.status_code == 200 else {}
            if "weight_version" in body:
                label = whole_version(body["weight_version"])
                if label is not None:
                    return label
                folder = body.get("model_path")
                return read_policy_version(folder) if isinstance(folder, str) and Path(folder).is_dir() else None
        return None

    def adapter_version(self, admin: Any, info: Mapping[str, Any], name: str) -> int | None:
        """The policy version of the folder ``/v1/models`` says adapter ``name`` was loaded from."""
        for card in admin.request("GET", "/v1/models").json().get("data", []):
            if card.get("id") == name:
                root = card.get("root")
                return read_policy_version(root) if isinstance(root, str) and Path(root).is_dir() else None
        return None

    def probe(self, admin: Any, model_name: str, prompt: list[int]) -> tuple[list[int], list[float]]:
        """Four tokens sampled at temperature 1 after ``prompt`` from the base weights: ids, log-probs."""
        body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 4, "temperature": 1.0, "sampling_seed": 0},
                "return_logprob": True, "stream": False}
        entries = _json(admin.request("POST", "/generate", json=body)).get("meta_info", {}).get(
            "output_token_logprobs")
        if not isinstance(entries, list) or not entries:
            raise BackendError(f"{admin.url}/generate answered a probe without meta_info.output_token_logprobs")
        return [int(e[1]) for e in entries], [float(e[0]) for e in entries]


def _json(response: Any) -> dict[str, Any]:
    try:
        data = response.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}
