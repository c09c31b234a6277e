"""The loop's configuration: :class:`GRPOConfig`.

Pydantic, strict and closed (``extra="forbid"``): a wrong type or an unknown key fails at
construction with the field named, as a :class:`~rlvr.errors.ConfigError`. Cross-field rules are
checked here, up front, never mid-run; those that involve the algorithm (a group-relative credit
needs ``group_k >= 2``) when the loop is built, before anything runs.
Only the loop's own knobs live here; backends carry their own settings.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Any, Literal

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rlvr.config.foreign_names import suggest
from rlvr.errors import ConfigError

# The vLLM releases rlvr is tested against (its HTTP shapes, LoRA and weight-reload endpoints): the
# one declaration that `make vllm` installs from and every vLLM server is checked against.
SUPPORTED_VLLM = ">=0.32,<0.33"
# The transformers and peft releases the test suite runs against (the trainer's model, tokenizer and
# LoRA paths). Outside them a run still starts, with a warning: these are validated, not required.
SUPPORTED_TRANSFORMERS = ">=5.24,<5.25"
SUPPORTED_PEFT = ">=0.21,<0.22"
SUPPORTED_ENGINES = {"transformers": SUPPORTED_TRANSFORMERS, "peft": SUPPORTED_PEFT}


class AdvantageKind(StrEnum):
    """How the reward becomes credit (:mod:`rlvr.algos.advantages`, :mod:`rlvr.algos.grpo`)."""

    GRPO = "grpo"  # group-relative: (r − μ)/(σ + ε)
    DR_GRPO = "dr_grpo"  # group-relative: r − μ
    RLOO = "rloo"  # group-relative: leave-one-out baseline
    REINFORCE_PP = "reinforce_pp"  # REINFORCE++: reward whitened over the batch's tokens
    REINFORCE_PP_BASELINE = "reinforce_pp_baseline"  # group mean subtracted, then whitened over the batch
    GLOBAL_BASELINE = "global_baseline"  # r − the batch's mean reward
    GAE = "gae"  # a critic's values, GAE over token positions (the trainer's critic: [critic])


def engine_windows(installed: Mapping[str, str | None]) -> dict[str, dict[str, Any]]:
    """For each engine of :data:`SUPPORTED_ENGINES`: its ``installed`` version (``None``: not
    installed), the validated ``window`` and whether the version is ``inside`` it (a local build
    suffix such as ``+cpu`` ignored; ``None`` when not installed or unreadable)."""
    out: dict[str, dict[str, Any]] = {}
    for name, window in SUPPORTED_ENGINES.items():
        version = installed.get(name)
        try:
            inside = None if version is None else version_window(window).contains(
                Version(version).public, prereleases=True)
        except InvalidVersion:
            inside = None
        out[name] = {"installed": version, "window": window, "inside": inside}
    return out


def outside_windows(windows: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """A warning for each installed engine outside its validated window."""
    return [f"{name} {w['installed']} is outside the validated window {w['window']!r} (rlvr.config."
            f"SUPPORTED_{name.upper()}): the run goes on, but this version is not one the test suite ran on"
            for name, w in windows.items() if w["inside"] is False]


def version_window(text: str) -> SpecifierSet:
    """``">=0.32,<0.33"`` as it is, a bare ``"0.32.0"`` as ``"==0.32.0"``; ValueError otherwise."""
    text = text.strip()
    try:
        return SpecifierSet(f"=={Version(text)}")
    except InvalidVersion:
        pass
    try:
        window = SpecifierSet(text)
    except InvalidSpecifier:
        window = SpecifierSet()
    if not len(window):
        raise ValueError(f"{text!r} is neither a version ('0.32.0') nor a version window ('>=0.32,<0.33')")
    return window


def config_error(exc: ValidationError, where: str, known: Iterable[str] = ()) -> ConfigError:
    """Turn a pydantic error into one that names each bad field as ``where.field``; an unknown key gets
    the rlvr key it most likely means (a TRL or verl name, a typo: :func:`rlvr.config.foreign_names.suggest`)."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        if err["type"] == "extra_forbidden":
            hint = suggest(f"{where}.{loc}", {where: known})
            lines.append(f"{where}.{loc}: unknown key" + (f"; {hint}" if hint else ""))
            continue
        got = f" (got {err['input']!r})" if "input" in err and not isinstance(err["input"], dict) else ""
        lines.append(f"{where}.{loc}: {err['msg']}{got}")
    return ConfigError("invalid configuration:\n  " + "\n  ".join(lines))


class StrictModel(BaseModel):
    """Base for every rlvr config section: strict types, unknown keys rejected, immutable."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, validate_default=True)

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise config_error(exc, type(self).__name__, type(self).model_fields) from None

    def digest(self) -> str:
        """sha256 of the resolved config as canonical JSON."""
        return hashlib.sha256(canonical_json(self.model_dump(mode="json")).encode()).hexdigest()


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class GRPOConfig(StrictModel):
    """Hyper-parameters of the RL loop. Defaults are a small, proven GRPO setting."""

    base: str | None = Field(None, min_length=1, description="policy base model: hub name or local folder")
    lora_rank: int = Field(16, ge=0, description="LoRA rank; 0 trains all weights")
    advantage: AdvantageKind = Field(AdvantageKind.GRPO, strict=False, description="advantage estimator of the "
                                     "rl-credit algorithms (grpo, echo); group-relative ones need group_k >= 2; "
                                     "'gae' needs a trainer with a critic ([critic], docs/critic.md). verl "
                                     "`algorithm.adv_estimator`")
    group_k: int = Field(4, ge=1, description="completions sampled per task")
    tasks_per_step: int = Field(8, ge=1, description="tasks drawn per train step")
    temp: float = Field(0.8, gt=0.0, le=10.0, description="sampling temperature for training rollouts")
    heldout_every: int = Field(10, ge=1, description="evaluate held-out at least every N steps")
    vllm_pin: str = Field(SUPPORTED_VLLM, min_length=1, description="vLLM versions the run accepts (PEP 440 window, "
                          "or one version); a vLLM server outside it is refused at start and after every restart")
    max_steps: int = Field(34, ge=1, description="train steps to run")
    epochs: int | None = Field(None, ge=1, description="stop once the training split has been seen this many times "
                               "(rows trained or filtered), or at max_steps, whichever comes first. TRL "
                               "`num_train_epochs`, verl `trainer.total_epochs`")
    corpus_min: int = Field(100, ge=1, description="refuse corpora smaller than this")
    heldout_frac: float = Field(0.2, gt=0.0, lt=1.0, description="fraction of the corpus held out")
    heldout_max_rows: int | None = Field(
        512, ge=1, description="held-out rows scored at each evaluation: a stable sample by content hash of the "
        "held-out split (the rest stays held out, never trained on); None: all of them")
    train_eval: bool = Field(
        True, description="at each held-out evaluation, also score as many training rows the same way (greedy, same "
        "budget): the like-for-like pool-vs-held-out gap; the pool score stays the mean reward of training samples")
    warn_flat_steps: int = Field(
        5, ge=1, description="warn when every group of this many consecutive steps has equal rewards (or one reward "
        "for every sample): nothing is learned from such steps")
    kl_coef: float = Field(0.0, ge=0.0, description="weight of the KL penalty to the reference")
    lr: float = Field(1e-5, gt=0.0, le=1.0, description="learning rate")
    seed: int = Field(0, ge=0, description="seeds the split salt-free draw order and sampling")
    heldout_patience: int | None = Field(None, ge=1, description="stop after N evals without improvement")
    checkpoint_every: int | None = Field(None, ge=1, description="checkpoint period; default heldout_every")
    keep_last: int = Field(3, ge=1, description="checkpoints kept besides the best one")
    split_salt: str = Field("rlvr-heldout-v1", min_length=1, description="salt of the split hash")
    # ---- rollouts: staleness, groups, filtering (see rlvr.rollouts.admission and rlvr.rollouts.stream) ----------
    max_head_offpolicy_versions: int = Field(
        0, ge=0, description="O: a row sampled under policy v is trained at a version <= v + O (0: on-policy)")
    synchronous_training: bool = Field(
        False, description="sample only while the loop waits for a batch: nothing overlaps a train step")
    max_rows_in_flight: int | None = Field(None, ge=1, description="rows sampling at once; default unbounded")
    min_group_size: int | None = Field(
        None, ge=1, description="a row with fewer usable samples is filtered; default min(2, group_k)")
    filter_zero_variance: bool = Field(False, description="filter groups whose rewards are all equal")
    max_oversample: float = Field(
        2.0, ge=1.0, description="at most this x tasks_per_step rows admitted per batch; then train on what there is")
    rollout_timeout_s: float | None = Field(
        600.0, gt=0.0, description="bound on one rollout-function call's own work (environment turns, tool calls, an "
        "agent between its model calls), in training and held-out evaluation; waiting for generation is not counted; "
        "a late sample counts as an error; None: unbounded")
    reward_timeout_s: float | None = Field(
        60.0, gt=0.0, description="bound on one reward call, in training and held-out evaluation; a late reward "
        "counts as an error; None: unbounded")
    on_sample_error: Literal["fail", "drop"] = Field(
        "fail", description="a training sample whose rollout or reward raises, times out or returns a non-finite "
        "value: stop, or count and drop. Held-out evaluation always stops on such a sample: a held-out score is "
        "never computed around a broken one")

    @field_validator("vllm_pin")
    @classmethod
    def _pin_is_a_window(cls, pin: str) -> str:
        version_window(pin)
        return pin.strip()

    @model_validator(mode="after")
    def _rollout_rules(self) -> GRPOConfig:
        if self.synchronous_training and self.max_head_offpolicy_versions:
            raise ValueError("synchronous_training samples nothing ahead of the policy: "
                             "max_head_offpolicy_versions must be 0 with it")
        if self.min_group_size is not None and self.min_group_size > self.group_k:
            raise ValueError(f"min_group_size={self.min_group_size} exceeds group_k={self.group_k}")
        return self

    @property
    def group_minimum(self) -> int:
        return self.min_group_size if self.min_group_size is not None else min(2, self.group_k)

    @property
    def rows_per_batch_cap(self) -> int:
        return max(self.tasks_per_step, math.ceil(self.max_oversample * self.tasks_per_step))

    @property
    def checkpoint_period(self) -> int:
        return self.checkpoint_every or self.heldout_every
