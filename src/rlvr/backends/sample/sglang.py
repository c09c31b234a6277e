"""The SGLang sampler: a :class:`~rlvr.rollouts.episodes.Generator` (and a
:class:`~rlvr.protocols.Scorer`) over SGLang's native API. The admin calls its weight-sync lanes
make, and the server rlvr starts, are in :mod:`rlvr.backends.serve.sglang`.

Token in, token out, one request per sample: ``POST /generate`` with ``input_ids``,
``sampling_params`` (SGLang's names: ``max_new_tokens``, ``temperature``, ``top_p``, ``top_k``,
``min_p``, ``repetition_penalty``, ``stop``, ``stop_token_ids``, ``sampling_seed``) and
``return_logprob``; the answer's ``meta_info.output_token_logprobs`` is a list of
``[logprob, token_id, text]``, one per generated token, read for both the ids and the log-probs
(``output_ids`` is only a cross-check), and ``meta_info.finish_reason.type`` is ``stop``,
``length`` or ``abort``. A sample per request rather than ``n`` per prompt because SGLang draws
the ``n`` samples of one request from one ``sampling_seed``, and its own documentation advises
repeating the prompt instead; it batches concurrent requests and shares their prompt's KV cache
(radix cache) anyway. A LoRA adapter is named per request (``lora_path``: the adapter's name).

Scoring asks the same ``/generate`` for ``logprob_start_len = 0`` with one greedy token and reads
``meta_info.input_token_logprobs`` (``None`` for the first prompt token).

The policy version of a completion is ``meta_info.weight_version`` when it is a whole number (the
label the disk lane sets on every reload); that label is the base weights', so a completion from a
hot-loaded adapter, or without a label, takes the version the lane last confirmed when the request
went out (each version's adapter has a name of its own).

Which log-probs: the importance ratio needs those of the distribution sampled from. With
``loop.temp = 1``, ``top_p = 1``, ``top_k`` off and ``min_p = 0`` (rlvr's defaults) every convention
agrees (raw model, after temperature, after truncation); with other settings check how the SGLang
version in use reports them (``rlvr serve`` reports the processed ones, as vLLM's
``--logprobs-mode processed_logprobs`` does). A seed draws reproducibly only in
SGLang's deterministic-inference mode (``--enable-deterministic-inference``); otherwise it is a best
effort, as with vLLM under varying batches.

Failure policy: :class:`~rlvr.backends.sample.http.Endpoint`'s (every call bounded, transport
errors and 5xx retried, a 4xx refused naming the status and the request).

A backend module: imports httpx.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from rlvr.backends.sample.http import LOGPROB_FLOOR, Endpoint, optional_knobs
from rlvr.errors import BackendError, safe_repr
from rlvr.types import Completion, SamplingParams, StopReason

_STOP = {"stop": StopReason.STOP, "length": StopReason.LENGTH, "abort": StopReason.ABORT}


class SGLangGenerator(Endpoint):
    """``await gen.generate(prompt_ids, params, seed=...)`` against an SGLang server at ``base_url``.

    ``model`` is the served model's name; a weight-sync lane that hot-loads adapters sets it to the
    adapter's name, which then goes out as ``lora_path`` (SGLang selects adapters per request, not
    by model name). ``served_version`` is set by the lane after every confirmed publish.
    """

    kind = "SGLang sampler"

    def __init__(self, base_url: str, model: str | None, *, max_concurrency: int = 64, timeout_s: float = 120.0,
                 **kwargs: Any):
        super().__init__(base_url, model, max_concurrency=max_concurrency, timeout_s=timeout_s, **kwargs)
        self.base_model = model
        self.served_version: int | None = None

    def _adapter(self) -> dict[str, Any]:
        return {"lora_path": self.model} if self.model is not None and self.model != self.base_model else {}

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams, *, seed: int,
                       session_id: str | None = None) -> Completion:
        if not prompt_ids:
            raise BackendError(f"{self.kind} ({self.url}): empty prompt")
        if params.bad_words_ids or params.allowed_token_ids is not None:
            # SGLang's /generate has neither; dropping them would sample what the caller forbade.
            raise BackendError(f"{self.kind} ({self.url}): SamplingParams.bad_words_ids and allowed_token_ids "
                               "cannot be sent to SGLang's /generate; use the in-process engine or rlvr serve")
        prompt = [int(t) for t in prompt_ids]
        body = {"input_ids": prompt, "sampling_params": sampling_params(params, seed), "return_logprob": True,
                "logprob_start_len": -1, "stream": False, **self._adapter()}
        headers = {"X-Session-ID": session_id} if session_id is not None else None
        what = f"model {self.model!r}, prompt of {len(prompt)} tokens"
        sent_under = self.served_version
        data = await self._request("POST", "/generate", what, json=body, headers=headers)
        return self.completion(data, what, sent_under, adapter="lora_path" in body)

    def completion(self, data: Any, what: str, sent_under: int | None = None, *, adapter: bool = False) -> Completion:
        """A :class:`Completion` from one ``/generate`` answer; a body without its token ids and
        log-probs is a :class:`BackendError` naming the request. ``weight_version`` labels the base
        weights only, so a completion from an adapter (``adapter``) takes ``sent_under``, the
        version the lane confirmed when the request went out (the adapter's name is per version)."""
        where = f"{self.kind}: POST {self.url}/generate ({what})"
        meta = data.get("meta_info") if isinstance(data, dict) else None
        entries = meta.get("output_token_logprobs") if isinstance(meta, dict) else None
        if not isinstance(meta, dict) or not isinstance(entries, list):
            raise BackendError(f"{where} returned no meta_info.output_token_logprobs "
                               f"({safe_repr(data, 160)}); the request sets return_logprob, so the server is not "
                               "SGLang's /generate")
        try:
            ids = [int(e[1]) for e in entries]
            values = [e[0] for e in entries]
        except (TypeError, IndexError, ValueError):
            raise BackendError(f"{where}: output_token_logprobs entries are not [logprob, token_id, text]: "
                               f"{safe_repr(entries, 160)}") from None
        output_ids = data.get("output_ids")
        if isinstance(output_ids, list) and [int(t) for t in output_ids] != ids:
            raise BackendError(f"{where}: output_ids {safe_repr(output_ids, 80)} disagree with the ids of "
                               f"output_token_logprobs {safe_repr(ids, 80)}")
        lps = tuple(float(v) if isinstance(v, int | float) and math.isfinite(v) else LOGPROB_FLOOR for v in values)
        reason = meta.get("finish_reason")
        kind = str(reason.get("type") if isinstance(reason, dict) else reason)
        version = None if adapter else whole_version(meta.get("weight_version"))
        return Completion(tuple(ids), lps, _STOP.get(kind, StopReason.ABORT), version if version is not None
                          else sent_under)

    # ---- the Scorer protocol -------------------------------------------------------------------
    async def score(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> list[float]:
        """``log p(completion_ids[t] | prompt_ids + completion_ids[:t])`` at temperature 1, from
        ``meta_info.input_token_logprobs``; a missing or non-finite entry names its position."""
        if not prompt_ids:
            raise BackendError(f"{self.kind} ({self.url}): score needs a non-empty prompt")
        if not completion_ids:
            return []
        ids = [int(t) for t in prompt_ids] + [int(t) for t in completion_ids]
        n = len(completion_ids)
        what = f"model {self.model!r}, scoring {n} tokens after a prompt of {len(prompt_ids)}"
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
                "return_logprob": True, "logprob_start_len": 0, "stream": False, **self._adapter()}
        data = await self._request("POST", "/generate", what, json=body)
        meta = data.get("meta_info") if isinstance(data, dict) else None
        entries = meta.get("input_token_logprobs") if isinstance(meta, dict) else None
        where = f"{self.kind}: POST {self.url}/generate ({what})"
        if not isinstance(entries, list) or len(entries) != len(ids):
            got = f"{len(entries)} entries" if isinstance(entries, list) else safe_repr(entries, 80)
            raise BackendError(f"{where} returned input_token_logprobs {got}, expected {len(ids)} (one per prompt "
                               "token, from logprob_start_len = 0)")
        out = []
        for pos in range(len(ids) - n, len(ids)):
            entry = entries[pos]
            value = entry[0] if isinstance(entry, list | tuple) and entry else None
            if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
                raise BackendError(f"{where}: completion position {pos - (len(ids) - n)} (token {ids[pos]}) has no "
                                   f"finite log-prob: {safe_repr(entry, 80)}")
            out.append(float(value))
        return out


def sampling_params(params: SamplingParams, seed: int) -> dict[str, Any]:
    """rlvr's sampling parameters under SGLang's names; knobs at their "off" value are left out."""
    return {"max_new_tokens": params.max_tokens, "temperature": params.temperature, "top_p": params.top_p,
            "sampling_seed": seed % (1 << 63), **optional_knobs(params)}


def whole_version(value: Any) -> int | None:
    """A weight-version label that is a whole number, as an int (SGLang's labels are strings)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return int(value) if isinstance(value, str) and value.isdigit() else None
