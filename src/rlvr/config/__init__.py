"""The whole TOML schema, torch-free: where every key of a run is defined.

``loop`` (:class:`GRPOConfig`, the ``[loop]`` section and the Python API's config) · ``run``
(:class:`~rlvr.config.run.RunConfig`: every section of an ``rlvr train`` file together, loading and
dotted overrides) · ``sections`` (``[model]``, ``[task]``, ``[sft]``, ``[sampler]``, ``[watchdog]``,
``[log]``, ``[cluster]``) · ``algo_section`` · ``train_section`` · ``critic_section`` ·
``foreign_names`` and ``unknown_keys`` (TRL's and verl's names for rlvr's keys; unknown keys said
together) · ``reference`` (the generated configuration reference). Standard library + pydantic only.
"""

from rlvr.config.loop import (
    SUPPORTED_PEFT,
    SUPPORTED_TRANSFORMERS,
    SUPPORTED_VLLM,
    AdvantageKind,
    GRPOConfig,
    StrictModel,
    canonical_json,
    config_error,
    engine_windows,
    version_window,
)

__all__ = ["SUPPORTED_PEFT", "SUPPORTED_TRANSFORMERS", "SUPPORTED_VLLM", "AdvantageKind", "GRPOConfig", "StrictModel",
           "canonical_json", "config_error", "engine_windows", "version_window"]
