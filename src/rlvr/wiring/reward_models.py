"""``rm:`` entries of ``task.rewards``: sequence-classification reward models, loaded once per run
on the policy's device (``model.device``) and scored in batches (:mod:`rlvr.backends.model.reward_model`).

The composition root resolves them because a reward model needs torch and transformers, which the
environments layer never imports; every other reward spec goes to :func:`rlvr.envs.environment`.
A model is loaded once per process for a given spec and device, however many times the rows are read.
"""

from __future__ import annotations

from collections.abc import Callable

from rlvr.envs import environment
from rlvr.protocols import LoadedEnv

RM_PREFIX = "rm:"
_LOADED: dict[tuple[str, str], LoadedEnv] = {}


def is_rm_spec(spec: str) -> bool:
    return spec.startswith(RM_PREFIX)


def reward_loader(device: str) -> Callable[[str], LoadedEnv]:
    """What loads one entry of ``task.rewards``: a reward model on ``device`` for ``rm:`` specs, the
    environment a spec names otherwise."""

    def load(spec: str) -> LoadedEnv:
        return reward_model_env(spec, device) if is_rm_spec(spec) else environment(spec)

    return load


def reward_model_env(spec: str, device: str) -> LoadedEnv:
    """The reward model ``spec`` names, as an environment whose reward is its score."""
    key = (spec, device)
    if key not in _LOADED:
        from rlvr.backends.model.reward_model import RewardModel, parse_rm_spec, rm_name

        source, options = parse_rm_spec(spec)
        model = RewardModel(source, device, **options)
        _LOADED[key] = LoadedEnv(name=rm_name(source), reward_fn=model.reward_fn, spec=spec, source=model)
    return _LOADED[key]
