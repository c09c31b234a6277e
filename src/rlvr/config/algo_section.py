"""``[algo]`` (and each ``[envs.NAME.algo]``): which algorithm credits a run's rows, and the reference
models it declares, the policy itself or an OpenAI-compatible endpoint (:class:`Endpoint`); the
``teacher`` alias folded into the slot each type declares. Standard library + pydantic only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from rlvr.config import StrictModel, canonical_json
from rlvr.errors import ConfigError


class Endpoint(StrictModel):
    """A frozen model behind an OpenAI-compatible server (``rlvr serve``, vLLM) sharing the policy's
    tokenizer: a teacher to score against or to sample from."""

    name: str = Field(min_length=1, description="the served model name")
    base_url: str = Field(min_length=1, description="e.g. http://127.0.0.1:8011/v1")
    max_concurrency: int = Field(16, ge=1, description="requests in flight at once")
    timeout_s: float = Field(60.0, gt=0, description="bound on each request")


ModelRef = Literal["policy"] | Endpoint


class AlgoSampling(StrictModel):
    """Where an algorithm's rows are sampled from: the policy, or (``sft``) a frozen endpoint."""

    source: ModelRef = "policy"


ALGO_TYPES = ("grpo", "max_rl", "reward", "custom", "opd", "opsd", "sft", "echo")
# Where ``algo.teacher`` folds for each algorithm that has a teacher: the reference it scores against
# (opd, opsd) or the frozen model it samples from (sft).
TEACHER_SLOTS = {"opd": "model", "opsd": "model", "sft": "sampling.source"}
# Keys accepted in a config and folded away before it resolves, with what the reference says of each.
WRITE_ONLY_KEYS = {"algo": {"teacher": "another name for the slot the type declares, folded into it: algo.model "
                                       "for opd and opsd, algo.sampling.source for sft (both given: they must agree)"}}
ADVANTAGE_READERS = ("grpo", "echo")  # the algorithms whose credit loop.advantage chooses


class AlgoSection(StrictModel):
    """The algorithm that turns scored samples into what the trainer learns (:mod:`rlvr.algos`).

    ``type`` names it and its defaults are its vetted setting. ``model`` is the reference of
    ``opd`` (a teacher endpoint) and ``opsd`` (``"policy"`` by default); ``sampling.source`` is the
    frozen endpoint ``sft`` imitates; ``import_path``/``kwargs`` what ``custom`` runs (a credit function,
    or an :class:`~rlvr.algos.Algorithm` subclass built with ``kwargs``) and ``echo``'s optional token
    filter; ``roles`` the per-role ce weights of ``echo`` (default ``{tool = 0.1}``); ``demo_field`` /
    ``demo_template`` where ``opsd`` finds and shows the demonstration. ``weight`` scales every
    component weight the algorithm assigns: in a run of several environments it balances their
    losses (see :mod:`rlvr.algos.base`). A key the type does not use is refused, as is a combination
    that cannot learn (``opd`` against the policy itself, ``sft`` from the policy's own samples).

    ``teacher`` is an alias, written only: it folds into the slot the type declares
    (:data:`TEACHER_SLOTS`: ``model`` for ``opd``/``opsd``, ``sampling.source`` for ``sft``), filling it
    when empty and otherwise having to name the same model; the resolved config holds the slot alone.
    """

    type: Literal["grpo", "max_rl", "reward", "custom", "opd", "opsd", "sft", "echo"] = Field(
        "grpo", description="the algorithm (docs/algorithms.md)")
    model: ModelRef | None = None
    sampling: AlgoSampling = Field(default_factory=AlgoSampling)
    import_path: str | None = Field(
        None, min_length=1, description="custom: 'package.module:name' or 'path/file.py:name' naming a credit "
        "function fn(inputs, **kwargs) -> list[list[float]] or an Algorithm subclass built as Cls(**kwargs); echo: "
        "an optional token filter fn(segments, **kwargs) -> list[list[bool]] (False drops a token from ce). "
        "TRL, verl: none (verl registers advantage estimators in code)")
    kwargs: dict[str, int | float | str | bool | list[str] | None] = Field(
        default_factory=dict, description="keyword arguments for what algo.import_path names")
    roles: dict[str, float] | None = Field(None, description="echo: the ce weight of environment tokens by role")
    demo_field: str | None = Field(None, min_length=1, description="opsd: the row field holding the demonstration")
    demo_template: str | None = Field(None, min_length=1, description="opsd: how the demonstration is shown")
    weight: float = Field(1.0, gt=0, allow_inf_nan=False, description="scales this algorithm's loss components")

    @model_validator(mode="before")
    @classmethod
    def _fold_teacher(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "teacher" not in data:
            return data
        data = dict(data)
        teacher, kind = data.pop("teacher"), data.get("type", "grpo")
        slot = TEACHER_SLOTS.get(kind)
        if slot is None:
            raise ValueError(f"algo.teacher: type = {kind!r} has no teacher (only "
                             f"{', '.join(f'{t} (algo.{s})' for t, s in TEACHER_SLOTS.items())}); remove it")
        sampling = data.get("sampling") or {}
        given = sampling.model_fields_set if isinstance(sampling, BaseModel) else set(sampling)
        current = data.get("model") if slot == "model" else field_of(sampling, "source") if "source" in given else None
        if current is None:
            return {**data, "model": teacher} if slot == "model" else with_default(data, "sampling", "source", teacher)
        if ref_key(current) != ref_key(teacher):
            raise ValueError(f"algo.teacher and algo.{slot} name different models ({ref_name(teacher)} and "
                             f"{ref_name(current)}); algo.teacher is another name for algo.{slot}: set one")
        return data

    @model_validator(mode="after")
    def _fits_the_type(self) -> AlgoSection:
        t = self.type
        uses = {"model": ("opd", "opsd"), "import_path": ("custom", "echo"), "kwargs": ("custom", "echo"),
                "roles": ("echo",),
                "demo_field": ("opsd",), "demo_template": ("opsd",)}
        for key, types in uses.items():
            if getattr(self, key) not in (None, {}) and t not in types:
                raise ValueError(f"algo.{key} is not used by type = {t!r} (only by {', '.join(types)}); remove it")
        if t == "opd" and not isinstance(self.model, Endpoint):
            raise ValueError("type = 'opd' distils from a teacher: set algo.model = {name = ..., base_url = ...} "
                             + ("(the policy as its own teacher has KL 0 and learns nothing)"
                                if self.model == "policy" else "(an OpenAI-compatible endpoint)"))
        if t == "sft" and not isinstance(self.sampling.source, Endpoint):
            raise ValueError("type = 'sft' learns from a frozen model's samples: set algo.sampling.source = "
                             "{name = ..., base_url = ...} (the policy's own samples are not a target to imitate)")
        if t != "sft" and self.sampling.source != "policy":
            raise ValueError(f"algo.sampling.source: type = {t!r} samples from the policy (its credit needs the "
                             "policy's own log-probs); only 'sft' samples from a frozen endpoint")
        if self.kwargs and self.import_path is None:
            raise ValueError("algo.kwargs are the keyword arguments of what algo.import_path names: set "
                             "algo.import_path or drop them")
        if t == "custom" and self.import_path is None:
            raise ValueError("type = 'custom' needs algo.import_path = 'package.module:name' or 'path/file.py:name' "
                             "(a credit function or an Algorithm subclass)")
        return self


def field_of(section: Any, key: str) -> Any:
    """A key of a config section given either as its model or as a mapping (a validator's raw input)."""
    return getattr(section, key) if isinstance(section, BaseModel) else section.get(key)


def ref_key(ref: Any) -> str:
    """A model reference (``"policy"``, an :class:`Endpoint` or its mapping) in one comparable form,
    defaults filled; one that is not a valid endpoint as given (its own validation names the fault)."""
    if isinstance(ref, Mapping):
        try:
            ref = Endpoint(**ref)
        except (ConfigError, TypeError):
            return canonical_json(dict(ref))
    return canonical_json(ref.model_dump(mode="json")) if isinstance(ref, Endpoint) else canonical_json(ref)


def ref_name(ref: Any) -> str:
    if isinstance(ref, (Mapping, Endpoint)):
        return f"{field_of(ref, 'name')!r} at {field_of(ref, 'base_url')}"
    return repr(ref)


def with_default(data: dict[str, Any], name: str, key: str, value: Any) -> dict[str, Any]:
    """``data`` with section ``name``'s ``key`` set to ``value``, the section a model or a mapping."""
    section = data.get(name) or {}
    if isinstance(section, BaseModel):
        return {**data, name: section.model_copy(update={key: value})}
    return {**data, name: {**section, key: value}}
