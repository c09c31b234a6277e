"""The algorithm each ``[algo]`` section names, built with the reference models it declares: the
policy itself, or an OpenAI-compatible endpoint (a scorer, or a frozen generator for ``sft``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from rlvr.algos import GRPO, OPD, OPSD, SFT, Algorithm, MaxRL, RawReward
from rlvr.backends.model.tokenizer import HFChatTokenizer
from rlvr.config.algo_section import Endpoint
from rlvr.config.run import AlgoSection, RunConfig
from rlvr.types import SamplingParams
from rlvr.wiring.user_algos import custom_algorithm, echo_algorithm, loaded


def build_algorithm(cfg: RunConfig, algo: AlgoSection, where: str, policy_scorer: Any,
                    tokenizer: HFChatTokenizer, closers: list[Callable[[], None]]) -> Algorithm:
    """``[algo]`` as an :class:`~rlvr.algos.Algorithm` with its ``weight``, its references connected and
    checked: a teacher endpoint that cannot answer prompt log-probs, or a custom function that does not
    import, fails here, before step 0, naming the field."""
    return _algorithm(cfg, algo, where, policy_scorer, tokenizer, closers).with_weight(algo.weight)


def _algorithm(cfg: RunConfig, algo: AlgoSection, where: str, policy_scorer: Any,
               tokenizer: HFChatTokenizer, closers: list[Callable[[], None]]) -> Algorithm:
    t, advantage = algo.type, str(cfg.loop.advantage)
    if t == "grpo":
        return GRPO(advantage)
    if t == "echo":
        return echo_algorithm(algo, advantage, where)
    if t == "max_rl":
        return MaxRL()
    if t == "reward":
        return RawReward()
    if t == "custom":
        return custom_algorithm(algo, where)
    if t == "sft":
        return SFT(algo.sampling.source.model_dump())  # type: ignore[union-attr]
    scorer = policy_scorer if algo.model == "policy" or algo.model is None else endpoint_scorer(
        algo.model, f"{where}.model", closers)
    described = algo.model.model_dump() if isinstance(algo.model, Endpoint) else "policy"
    if t == "opd":
        return OPD(scorer, described)
    return OPSD(scorer, tokenizer, described, demo_field=algo.demo_field,
                **({"demo_template": algo.demo_template} if algo.demo_template else {}))


def check_algorithms(cfg: RunConfig) -> None:
    """Before anything is written or warm-started: what every ``import_path`` names imports and every teacher
    answers prompt log-probs (a probe of two tokens), each failure naming its field."""
    for name, algo in cfg.algorithms().items():
        where = "algo" if name is None or cfg.envs[name].algo is None else f"envs.{name}.algo"
        if algo.import_path is not None:
            loaded(algo, where)
        if isinstance(algo.model, Endpoint):
            closers: list[Callable[[], None]] = []
            endpoint_scorer(algo.model, f"{where}.model", closers, probe=True)
            for close in closers:
                close()


def endpoint_scorer(model: Endpoint, field: str, closers: list[Callable[[], None]], probe: bool = False) -> Any:
    """A client of a teacher endpoint; ``probe`` checks it answers prompt log-probs (done once, at load)."""
    from rlvr.backends.sample.scoring import EndpointScorer  # httpx: only when a run has a teacher

    scorer = EndpointScorer(model.base_url, model.name, max_concurrency=model.max_concurrency,
                            timeout_s=model.timeout_s)
    if probe:
        scorer.check(field)
    closers.append(scorer.close)
    return scorer


def frozen_generator(source: Endpoint, cfg: RunConfig, closers: list[Callable[[], None]]) -> Any:
    """A generator over a frozen endpoint (``sft``'s source); its samples carry no policy version, so
    they never age out of the staleness window."""
    from rlvr.backends.sample.http import HTTPGenerator

    inner = HTTPGenerator(source.base_url, source.name, max_concurrency=source.max_concurrency,
                          timeout_s=source.timeout_s, retries=cfg.sampler.retries)

    class Frozen:
        async def generate(self, prompt_ids: Any, params: SamplingParams, *, seed: int) -> Any:
            out = await inner.generate(prompt_ids, params, seed=seed)
            return dataclasses.replace(out, version=None)

        def describe(self) -> dict[str, Any]:
            return {"type": "frozen endpoint", "name": source.name, "base_url": source.base_url}

    closers.append(lambda: _close_http(inner))
    return Frozen()


def _close_http(generator: Any) -> None:
    import asyncio

    try:
        asyncio.run(generator.aclose())
    except RuntimeError:
        pass  # no event loop to close on: nothing was opened
