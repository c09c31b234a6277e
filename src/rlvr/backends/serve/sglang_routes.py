"""SGLang's native routes on ``rlvr serve``: the same model host answering SGLang's shapes, so the
SGLang sampler and its lanes (:mod:`rlvr.backends.sample.sglang`) run for real without SGLang.

- ``POST /generate``: ``input_ids`` (one prompt or a batch) or ``text``, ``sampling_params`` in
  SGLang's names (``max_new_tokens`` default 128, ``temperature``, ``top_p``, ``top_k``, ``min_p``,
  ``repetition_penalty``, ``stop``, ``stop_token_ids``, ``n``, ``sampling_seed``, ...),
  ``return_logprob``, ``logprob_start_len``, ``lora_path`` (a loaded adapter's name). Each answer
  is ``{"text", "output_ids", "meta_info": {"id", "finish_reason": {"type", "matched"|"length"},
  "prompt_tokens", "completion_tokens", "cached_tokens", "weight_version", "output_token_logprobs",
  "input_token_logprobs"}}``, log-prob entries ``[logprob, token_id, None]``; one prompt with
  ``n = 1`` answers an object, anything else a list (prompt-major, ``n`` per prompt), as SGLang does.
- ``POST /update_weights_from_disk`` ``{model_path, weight_version, flush_cache, ...}`` reloads full
  weights (safetensors in checkpoint names, from an allowed folder) and answers ``{"success",
  "message", "num_paused_requests"}``; a refusal is HTTP 400 with ``success: false``.
- ``GET /get_weight_version``, ``GET /model_info`` and ``GET /get_model_info``: the label
  (``weight_version``), the model folder (``model_path``); ``GET|POST /flush_cache`` (there is no
  prefix cache to flush); ``POST /load_lora_adapter`` and ``/unload_lora_adapter``.

Invariant: the request is translated into a ``/v1/completions`` body and answered by the same code
(:func:`~rlvr.backends.serve.completions.complete`), so both APIs sample, batch, bound, refuse and
version alike; a sampling parameter neither API's translation knows is refused naming
``sampling_params.NAME``. ``weight_version`` is the label the last reload set, else the served
policy version as a string.

A backend module: imports fastapi and pydantic.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, StrictInt

from rlvr.backends.disconnect import while_connected
from rlvr.backends.serve.completions import complete
from rlvr.backends.serve.model_host import ModelHost
from rlvr.backends.serve.requests import MAX_NAME, MAX_PATH, CompletionBody, parse
from rlvr.errors import BackendError, RequestError

SGLANG_MAX_NEW_TOKENS = 128  # SGLang's default
# SGLang's sampling names that differ from the OpenAI/vLLM names the completion body takes.
_RENAMED = {"max_new_tokens": "max_tokens", "sampling_seed": "seed", "min_new_tokens": "min_tokens"}
_KNOWN = {"temperature", "top_p", "top_k", "min_p", "repetition_penalty", "stop", "stop_token_ids", "n",
          "skip_special_tokens", "frequency_penalty", "presence_penalty", "ignore_eos", "logit_bias",
          "spaces_between_special_tokens", "no_stop_trim", *_RENAMED}


class GenerateBody(BaseModel):
    input_ids: list[StrictInt] | list[list[StrictInt]] | None = None
    text: str | list[str] | None = None
    sampling_params: dict[str, Any] = Field(default_factory=dict)
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    lora_path: str | None = Field(None, max_length=MAX_NAME)
    stream: bool = False
    rid: str | None = Field(None, max_length=256)


class UpdateFromDiskBody(BaseModel):
    model_path: str = Field(min_length=1, max_length=MAX_PATH)
    load_format: str | None = None
    weight_version: str | None = Field(None, max_length=MAX_NAME)
    flush_cache: bool = True
    abort_all_requests: bool = False


class LoadLoraBody(BaseModel):
    lora_name: str = Field(min_length=1, max_length=MAX_NAME)
    lora_path: str = Field(min_length=1, max_length=MAX_PATH)
    pinned: bool = False


class UnloadLoraBody(BaseModel):
    lora_name: str = Field(min_length=1, max_length=MAX_NAME)


def completion_body(body: GenerateBody) -> CompletionBody:
    """The ``/v1/completions`` request a ``/generate`` body means; what cannot be honoured is a 400."""
    if body.stream:
        raise RequestError("stream=true is not supported on rlvr serve's /generate; use /v1/completions to stream",
                           "stream")
    if body.top_logprobs_num:
        raise RequestError("top_logprobs_num is not supported on rlvr serve's /generate (only 0)", "top_logprobs_num")
    if (body.input_ids is None) == (body.text is None):
        raise RequestError("give input_ids or text (exactly one)", "input_ids")
    params = dict(body.sampling_params)
    unknown = sorted(set(params) - _KNOWN)
    if unknown:
        raise RequestError(f"sampling_params.{unknown[0]} is not a sampling parameter rlvr serve honours",
                           "sampling_params")
    if params.get("no_stop_trim"):
        raise RequestError("sampling_params.no_stop_trim=true is not supported by rlvr serve", "sampling_params")
    params.pop("no_stop_trim", None)
    if params.get("max_new_tokens", SGLANG_MAX_NEW_TOKENS) == 0:
        raise RequestError("sampling_params.max_new_tokens=0 is not supported by rlvr serve: it generates at least "
                           "one token (score with max_new_tokens=1)", "sampling_params")
    if isinstance(params.get("top_k"), int) and params["top_k"] >= 1 << 30:  # SGLang's "whole vocabulary"
        params["top_k"] = -1
    data = {_RENAMED.get(k, k): v for k, v in params.items()}
    data.setdefault("max_tokens", SGLANG_MAX_NEW_TOKENS)
    data.update(prompt=body.input_ids if body.input_ids is not None else body.text, model=body.lora_path,
                return_token_ids=True, logprobs=1 if body.return_logprob else None, request_id=body.rid)
    if body.return_logprob and body.logprob_start_len >= 0:
        data["prompt_logprobs"] = 0
    return parse(CompletionBody, data)


def answers(result: dict[str, Any], body: GenerateBody, label: str) -> dict[str, Any] | list[dict[str, Any]]:
    """SGLang's answer(s) from a ``/v1/completions`` result."""
    rows, out = result["choices"], []
    for row in rows:
        ids, prompt = row["token_ids"], row["prompt_token_ids"]
        reason = row["finish_reason"]
        finish = ({"type": "length", "length": len(ids)} if reason == "length"
                  else {"type": reason, "matched": row.get("stop_reason")})
        meta: dict[str, Any] = {"id": f"{result['id']}-{row['index']}", "finish_reason": finish,
                                "prompt_tokens": len(prompt), "completion_tokens": len(ids), "cached_tokens": 0,
                                "weight_version": label}
        if body.return_logprob:
            values = row["logprobs"]["token_logprobs"]
            meta["output_token_logprobs"] = [[v, t, None] for v, t in zip(values, ids, strict=True)]
            if body.logprob_start_len >= 0:
                per = row["prompt_logprobs"]
                entries = [[None if e is None else e[str(t)]["logprob"], t, None] for e, t in zip(per, prompt,
                                                                                                  strict=True)]
                meta["input_token_logprobs"] = entries[body.logprob_start_len:]
        out.append({"text": row["text"], "output_ids": ids, "meta_info": meta})
    single = body.text is None and body.input_ids is not None and not isinstance(body.input_ids[0], list)
    single = single or isinstance(body.text, str)
    return out[0] if single and len(out) == 1 else out


def add_sglang_routes(app: FastAPI, host: ModelHost, gate: Any) -> None:
    """Register SGLang's native routes on ``app``; ``gate`` reads and bounds request bodies."""
    labels: dict[str, str] = {}

    def label() -> str:
        return labels.get("weight_version", str(host.base_version))

    @app.post("/generate", response_model=None)
    async def generate(request: Request) -> Any:
        body = await gate.body_of(request, GenerateBody)
        if body.lora_path is not None:
            host.resolve(body.lora_path)  # an unknown adapter is a 404 naming it
        result = await while_connected(request, complete(host, completion_body(body)))
        return answers(result, body, label()) if isinstance(result, dict) else result

    _weight_routes(app, host, gate, labels, label)


def _weight_routes(app: FastAPI, host: ModelHost, gate: Any, labels: dict[str, str], label: Any) -> None:
    """SGLang's weight, adapter and info routes; ``labels`` holds the label the last reload set."""

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request) -> JSONResponse:
        body = await gate.body_of(request, UpdateFromDiskBody)
        if body.load_format not in (None, "auto", "safetensors"):
            return _refused(f"load_format={body.load_format!r} is not supported (safetensors only)")
        version = int(body.weight_version) if body.weight_version and body.weight_version.isdigit() else None
        try:
            count = await host.reload_weights(body.model_path, version)
        except (RequestError, BackendError) as exc:
            return _refused(str(exc))
        labels["weight_version"] = body.weight_version or str(host.base_version)
        return JSONResponse({"success": True, "message": f"Succeeded to update model weights ({count} tensors).",
                             "num_paused_requests": 0})

    @app.get("/get_weight_version")
    async def get_weight_version() -> dict[str, Any]:
        return {"weight_version": label()}

    async def model_info() -> dict[str, Any]:
        return {"model_path": host.model_dir, "tokenizer_path": host.model_dir, "is_generation": True,
                "weight_version": label(), "preferred_sampling_params": None}

    app.get("/model_info")(model_info)
    app.get("/get_model_info")(model_info)

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> JSONResponse:
        return JSONResponse({"success": True, "message": "Cache flushed (rlvr serve keeps no prefix cache)."})

    @app.post("/load_lora_adapter")
    async def load_lora_adapter(request: Request) -> JSONResponse:
        body = await gate.body_of(request, LoadLoraBody)
        try:
            await host.load_adapter(body.lora_name, body.lora_path, None)
        except RequestError as exc:
            return JSONResponse({"success": False, "error_message": str(exc)}, status_code=exc.status)
        return JSONResponse({"success": True, "error_message": "", "loaded_adapters": _loaded(host)})

    @app.post("/unload_lora_adapter")
    async def unload_lora_adapter(request: Request) -> JSONResponse:
        body = await gate.body_of(request, UnloadLoraBody)
        try:
            await host.unload_adapter(body.lora_name)
        except RequestError as exc:
            return JSONResponse({"success": False, "error_message": str(exc)}, status_code=exc.status)
        return JSONResponse({"success": True, "error_message": "", "loaded_adapters": _loaded(host)})


def _loaded(host: ModelHost) -> dict[str, str]:
    return {name: host.adapters[name].path for name in host.public_adapters()}


def _refused(message: str) -> JSONResponse:
    return JSONResponse({"success": False, "message": message, "num_paused_requests": 0}, status_code=400)
