"""A base model fetched from the Hugging Face hub, with bounded retries on transport errors only.

:func:`fetch_from_hub` downloads a hub name's files into the local Hugging Face cache and returns
the folder, which is what every loader then reads, so nothing after it needs the network
(:func:`cached_or_fetched`: a name already in the cache is not fetched again). :func:`with_retries`
is the policy, used for that download and for the pre-flight look-up (:mod:`rlvr.wiring.preflight`):

- a **transport error** (refused or dropped connection, DNS failure, timeout, a read cut short, an
  HTTP 5xx or 429 from the hub) is retried up to ``retries`` times, waiting ``backoff_s * 2**i``
  seconds before retry ``i`` (capped at ``max_backoff_s``), each wait printed;
- **anything else** (a name the hub does not know, a gated or private model, a missing revision,
  ``HF_HUB_OFFLINE`` set, a full disk) is raised at once: retrying cannot change the answer;
- ``RLVR_HUB_RETRIES`` and ``RLVR_HUB_BACKOFF_S`` change the retries and the first wait (defaults
  4 and 1 s: waits of 1, 2, 4 and 8 s, about 15 s in all before giving up);
- the last transport error is raised as :class:`~rlvr.errors.HubUnreachableError`, naming what was
  fetched, how many attempts were made and the cause.

An error counts as transport when it, or any error it was raised from (huggingface_hub wraps a
failed connection in a "not in the cache" error), is one of the above; library classes are
recognised by name, so the rule holds for the hub client whichever HTTP library it uses.

The download is a seam (``download=``), so the policy is tested with a fake transport that fails
a given number of times. A backend module: imports huggingface_hub when it downloads.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from rlvr.errors import ConfigError, HubUnreachableError

T = TypeVar("T")

# Classes (by name, anywhere in an error's MRO) that mean the bytes did not get through.
TRANSPORT_CLASSES = frozenset({
    "TransportError", "NetworkError", "ConnectError", "ReadError", "WriteError", "CloseError",
    "RemoteProtocolError", "ProxyError", "TimeoutException", "ConnectTimeout", "ReadTimeout", "WriteTimeout",
    "PoolTimeout", "ChunkedEncodingError", "ContentDecodingError", "IncompleteRead", "ProtocolError",
})
# Never transport, whatever they were raised from: the hub answered, or the caller chose offline.
DEFINITE_CLASSES = frozenset({"RepositoryNotFoundError", "GatedRepoError", "RevisionNotFoundError",
                              "EntryNotFoundError", "OfflineModeIsEnabled", "DisabledRepoError"})
# Weights the loaders never read: not downloaded.
NEVER_LOADED = ("*.h5", "*.msgpack", "*.onnx", "*.onnx_data", "*.ot", "*.tflite", "*.gguf", "*.mlmodel",
                "onnx/*", "original/*", "coreml/*", "openvino/*")
PICKLED_WEIGHTS = ("*.bin", "*.pt", "*.pth")  # skipped when the repository has safetensors


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How many times a transport error is retried and how long each wait is."""

    retries: int = 4
    backoff_s: float = 1.0
    max_backoff_s: float = 30.0

    def wait_before(self, retry: int) -> float:
        """Seconds to wait before retry ``retry`` (0-based): ``backoff_s * 2**retry``, capped."""
        return min(self.backoff_s * 2 ** retry, self.max_backoff_s)


    @classmethod
    def from_env(cls) -> RetryPolicy:
        """The default policy, or ``RLVR_HUB_RETRIES`` / ``RLVR_HUB_BACKOFF_S`` when set."""
        default = cls()  # with slots, ``cls.retries`` is the field's descriptor, not its default
        try:
            retries = int(os.environ.get("RLVR_HUB_RETRIES", default.retries))
            backoff = float(os.environ.get("RLVR_HUB_BACKOFF_S", default.backoff_s))
        except ValueError as exc:
            raise ConfigError(f"RLVR_HUB_RETRIES / RLVR_HUB_BACKOFF_S: not a number ({exc})") from None
        if retries < 0 or backoff < 0:
            raise ConfigError("RLVR_HUB_RETRIES and RLVR_HUB_BACKOFF_S must be >= 0")
        return cls(retries=retries, backoff_s=backoff)


def _names(exc: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(exc).__mro__}


def _status(exc: BaseException) -> int | None:
    status = getattr(getattr(exc, "response", None), "status_code", None)
    return status if isinstance(status, int) else None


def is_transport_error(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it was raised from) means the hub could not be reached, so that
    trying again later may succeed; see the module docstring."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        names = _names(current)
        if names & DEFINITE_CLASSES:
            return False
        status = _status(current)
        if status is not None:
            return status >= 500 or status == 429
        if names & TRANSPORT_CLASSES or isinstance(current, (ConnectionError, TimeoutError)):
            return True
        if isinstance(current, OSError) and type(current).__name__ == "gaierror":
            return True
        current = current.__cause__ or current.__context__
    return False


def with_retries(call: Callable[[], T], what: str, *, policy: RetryPolicy | None = None,
                 sleep: Callable[[float], None] = time.sleep, log: Callable[[str], None] = print) -> T:
    """``call()``, retried on transport errors as ``policy`` says (default: :meth:`RetryPolicy.from_env`);
    any other error is raised at once."""
    policy = policy or RetryPolicy.from_env()
    for attempt in range(policy.retries + 1):
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - sorted below: transport errors retried, the rest raised
            if not is_transport_error(exc):
                raise
            cause = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            if attempt == policy.retries:
                raise HubUnreachableError(f"{what}: the hub could not be reached after {attempt + 1} attempt(s); "
                                          f"last: {cause}", attempts=attempt + 1) from exc
            wait = policy.wait_before(attempt)
            log(f"hub: {what}: {cause}; retry {attempt + 1} of {policy.retries} in {wait:g}s")
            sleep(wait)
    raise AssertionError("unreachable")


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def hub_download(name: str, ignore_patterns: list[str]) -> str:
    """The default transport: ``snapshot_download`` into the local Hugging Face cache."""
    from huggingface_hub import snapshot_download

    return str(snapshot_download(repo_id=name, ignore_patterns=ignore_patterns))


def hub_files(name: str) -> list[str]:
    from huggingface_hub import HfApi

    return list(HfApi().list_repo_files(name))


def cached_or_fetched(name: str) -> str:
    """What loads hub model ``name``: the name itself when the local Hugging Face cache has it (the
    loaders read the cache, as they always did, with no network needed), else the folder
    :func:`fetch_from_hub` downloaded it to."""
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return name
    return fetch_from_hub(name)


def fetch_from_hub(name: str, *, download: Callable[[str, list[str]], str] = hub_download,
                   list_files: Callable[[str], list[str]] | None = hub_files, policy: RetryPolicy | None = None,
                   sleep: Callable[[float], None] = time.sleep, log: Callable[[str], None] = print) -> str:
    """The local folder holding hub model ``name`` (downloaded into the cache, or found there), its
    pickled weights skipped when it also has safetensors; every network call bounded by ``policy``."""
    ignore = list(NEVER_LOADED)
    if list_files is not None and not offline():
        files = with_retries(lambda: list_files(name), f"listing {name}'s files", policy=policy, sleep=sleep, log=log)
        if any(f.endswith(".safetensors") for f in files):
            ignore += PICKLED_WEIGHTS
    return with_retries(lambda: download(name, ignore), f"downloading {name}", policy=policy, sleep=sleep, log=log)
