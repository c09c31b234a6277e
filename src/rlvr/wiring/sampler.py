"""Where a run samples: the in-process engine over the live policy, or inference servers (rlvr
serve, vLLM or SGLang) behind a weight-sync lane; the sampling parameters and the held-out evaluator."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlvr.backends.model.policy import Policy
from rlvr.backends.model.tokenizer import HFChatTokenizer
from rlvr.backends.sample.engine import InProcessEngine
from rlvr.backends.sample.gate import gate_for
from rlvr.backends.sync.in_process import InProcessLane
from rlvr.config.run import RunConfig
from rlvr.errors import ConfigError
from rlvr.protocols import LoadedEnv, RolloutSetup
from rlvr.run.evaluation import EnvsEvaluator, RolloutEvaluator
from rlvr.types import SamplingParams
from rlvr.wiring.agents import agent_gateway
from rlvr.wiring.scale import cluster
from rlvr.wiring.scale.colocate import colocated_sampler_side
from rlvr.wiring.scale.fanout import pooled_sampler_side, several_servers
from rlvr.wiring.tasks import make_rollout_fn


def sampling_params(cfg: RunConfig, temperature: float) -> SamplingParams:
    """``[sampler]``'s sampling at ``temperature``; greedy (0) takes none of the knobs, so a greedy
    held-out score stays a property of the weights alone."""
    s = cfg.sampler
    if temperature == 0:
        return SamplingParams(max_tokens=cfg.completion_budget, temperature=0.0)
    return SamplingParams(max_tokens=cfg.completion_budget, temperature=temperature, top_p=s.top_p, top_k=s.top_k,
                          min_p=s.min_p, repetition_penalty=s.repetition_penalty)


def heldout_evaluator(cfg: RunConfig, policy: Policy, tokenizer: HFChatTokenizer, envs: dict[str | None, LoadedEnv],
                      closers: list[Callable[[], None]], *, temperature: float | None = None,
                      seed_offset: int = 0, generator: Any = None) -> Any:
    """Held-out episodes, played by each environment's own rollout function on the live weights
    (greedy: ``sampler.heldout_temperature``, unless ``temperature`` is given); ``seed_offset``
    gives a sampled evaluation draws of its own (``rlvr eval``'s sample j). ``generator``: play them
    there instead (the servers, under sharded ranks: :mod:`rlvr.wiring.scale.sharding`)."""
    live = generator
    if live is None:
        live = InProcessEngine(policy.model, eos_ids=policy.eos_ids, pad_id=policy.tokenizer.pad_token_id,
                               version=lambda: policy.version, name="rlvr-heldout", compile=cfg.sampler.compile)
        closers.append(live.close)
    params = sampling_params(cfg, cfg.sampler.heldout_temperature if temperature is None else temperature)
    context = getattr(policy.model.config, "max_position_embeddings", None)
    extras = {"agent_gateway": agent_gateway(cfg, envs, tokenizer, context, None, closers), "agent_phase": "heldout"}
    evaluators = {}
    for name, env in envs.items():
        section = cfg.env_sections()[name]
        env_tokenizer = tokenizer.with_tools(tool_schemas(env))
        evaluators[name] = RolloutEvaluator(
            make_rollout_fn(section, RolloutSetup(generator=live, tokenizer=env_tokenizer, env=env, params=params,
                                                  extras=extras)),
            env, seed=cfg.loop.seed + 1 + seed_offset, rollout_timeout_s=cfg.loop.rollout_timeout_s,
            reward_timeout_s=cfg.loop.reward_timeout_s)
    return evaluators[None] if None in evaluators else EnvsEvaluator(evaluators)  # type: ignore[arg-type]


def sampler_side(cfg: RunConfig, policy: Policy, base: Path,
                 run_dir: Path | None) -> tuple[Any, Callable[[int], int] | None, list[Callable[[], None]]]:
    """The training generator, the lane that brings it new weights, and what to close at exit."""
    s = cfg.sampler
    if s.backend == "in_process":
        engine, weight_sync = rollout_engine(cfg, policy)
        return engine, weight_sync, [engine.close]
    if s.backend == "vllm_colocate":
        return colocated_sampler_side(cfg, policy, base)
    if several_servers(cfg):  # one pool and one fan-out lane over single-server wirings
        return pooled_sampler_side(cfg, policy, base, run_dir, one=sampler_side)
    from rlvr.backends.sync import lanes  # httpx: only for the HTTP path

    lane = s.lane if s.lane != "auto" else auto_lane(cfg, policy)
    folder = run_dir if run_dir is not None else Path(tempfile.mkdtemp(prefix="rlvr-sync-"))
    sync_dir = folder / "sync"
    sync_dir.mkdir(parents=True, exist_ok=True)
    # In-flight requests may still name the adapters of the last O versions: keep those loaded.
    keep = cfg.loop.max_head_offpolicy_versions + 2
    api, server = server_api(cfg), None
    common = {"compatible": cfg.loop.vllm_pin if s.backend == "vllm" else s.server_compatible,
              "verify": s.verify_version, "api": api}
    generator = server_generator(cfg)  # a started server's url is set below
    if s.url is None:
        server = make_server(cfg, policy, base, folder / "server.log", sync_dir, keep)
        generator.diagnose = server.exit_report
    if lane == "kill_restart":
        if s.url is not None:
            raise ConfigError("sampler.lane = 'kill_restart' starts its own server: leave sampler.url unset")
        restart = lanes.KillRestartLane(policy, sync_dir, base_model_dir=base, keep=keep, generator=generator,
                                        server=server, **common)  # the lane points the generator at it
        return generator, restart, [restart.close]
    closers: list[Callable[[], None]] = []
    if server is not None:
        server.start()
        closers.append(server.stop)
        generator.url = server.url
    publish: lanes.LoraHotLoadLane | lanes.DiskReloadLane
    if lane == "lora_hot_load":
        publish = lanes.LoraHotLoadLane(policy, generator.url, sync_dir, keep=keep, generator=generator, **common)
    elif lane == "disk_reload":
        publish = lanes.DiskReloadLane(policy, generator.url, sync_dir, keep=keep, generator=generator, **common)
    else:
        raise ConfigError(f"sampler.lane={s.lane!r}: unknown lane")
    if server is not None:
        publish.admin.diagnose = server.exit_report
    try:
        publish.check_compatible()  # a server outside the accepted versions is refused before anything else
    except BaseException:
        for close in (publish.close, *closers):
            close()
        raise
    return generator, publish, [publish.close, *closers]


def server_generator(cfg: RunConfig) -> Any:
    """The client of one server: SGLang's native /generate, or the OpenAI-compatible completions."""
    s = cfg.sampler
    if s.backend == "sglang":
        from rlvr.backends.sample.sglang import SGLangGenerator as client
    else:
        from rlvr.backends.sample.http import HTTPGenerator as client  # type: ignore[assignment]
    return client(s.url if isinstance(s.url, str) else "http://127.0.0.1:1", s.served_model_name,
                  max_concurrency=s.max_concurrency, timeout_s=s.timeout_s, retries=s.retries)


def auto_lane(cfg: RunConfig, policy: Policy) -> str:
    """LoRA: hot-load. Full weights: reload in place, except on a vLLM that rlvr starts on the CPU,
    whose in-place reload does not reach its repacked linear layers: restart it instead."""
    if policy.is_lora:
        return "lora_hot_load"
    s = cfg.sampler
    return "kill_restart" if s.backend == "vllm" and s.url is None and cfg.model.device == "cpu" else "disk_reload"


def server_api(cfg: RunConfig) -> Any:
    """What differs between servers once they run: rlvr serve's admin surface, or vLLM's."""
    if cfg.sampler.backend == "vllm":
        from rlvr.backends.serve.vllm import VLLMApi

        return VLLMApi()
    if cfg.sampler.backend == "sglang":
        from rlvr.backends.serve.sglang import SGLangApi

        return SGLangApi()
    from rlvr.backends.sync.lanes import RlvrApi

    return RlvrApi()


def make_server(cfg: RunConfig, policy: Policy, base: Path, log_path: Path, sync_dir: Path, keep: int) -> Any:
    """The server process rlvr starts (not yet started): rlvr serve, or vLLM on the run's base."""
    s = cfg.sampler
    common = {"served_model_name": s.served_model_name, "command": s.serve_command, "stop_command": s.stop_command,
              "startup_timeout_s": s.startup_timeout_s, "log_path": log_path}
    if s.backend == "vllm":
        from rlvr.backends.serve.vllm import VLLMServer, find_vllm_python

        python = find_vllm_python(s.vllm_python) if s.serve_command is None else ""
        kwargs: dict[str, Any] = {"python": python, "dtype": cfg.model.dtype, "lora_rank": cfg.loop.lora_rank,
                                  "max_loras": keep, "seed": cfg.loop.seed, "kv_cache_gib": s.vllm_kv_cache_gib,
                                  "vllm_args": s.vllm_args, **common}
        factory: Any = VLLMServer
    elif s.backend == "sglang":
        from rlvr.backends.serve.sglang import SGLangServer, find_sglang_python

        python = find_sglang_python(s.sglang_python) if s.serve_command is None else ""
        kwargs = {"python": python, "dtype": cfg.model.dtype, "lora_rank": cfg.loop.lora_rank, "seed": cfg.loop.seed,
                  "sglang_args": s.sglang_args, **common}
        factory = SGLangServer
    else:
        from rlvr.backends.serve.process import ServerProcess

        kwargs = {"threads": s.server_threads, "allowed_dirs": [sync_dir], "device": cfg.model.device, **common}
        factory = ServerProcess
    if cluster.on_ray(cfg):  # the same server, owned by a Ray actor the cluster places
        return cluster.make_server(cfg, {"model_dir": str(base), **kwargs})
    return factory(base, **kwargs)


def rollout_engine(cfg: RunConfig, policy: Policy) -> tuple[InProcessEngine, InProcessLane]:
    """The in-process generator and how it gets new weights.

    On-policy (``max_head_offpolicy_versions = 0``) nothing samples during a train step, so the
    engine reads the live model and its lane only checks the version. Off-policy, sampling overlaps
    training, so the engine samples from its own replica, which receives the trainable weights
    after every step.
    """
    if cfg.loop.max_head_offpolicy_versions == 0:
        engine = InProcessEngine(policy.model, eos_ids=policy.eos_ids, pad_id=policy.tokenizer.pad_token_id,
                                 version=lambda: policy.version, share_prompts=cfg.sampler.share_prompts,
                                 compile=cfg.sampler.compile)
        return engine, InProcessLane(engine)
    engine = InProcessEngine.replica_of(policy, share_prompts=cfg.sampler.share_prompts, compile=cfg.sampler.compile)
    return engine, InProcessLane(engine, policy)


def generation_gauges(policy: Policy) -> Callable[[], dict[str, float]]:
    """The policy's device gate, read as this run's share: calls and seconds since now (the gate is
    the process's), and the most generate calls it ever held at once (1: no overlap)."""
    gate = gate_for(next(policy.model.parameters()).device)
    start = gate.readings()

    def read() -> dict[str, float]:
        return {key: value if key == "perf/gen/most_at_once" else value - start.get(key, 0.0)
                for key, value in gate.readings().items()}
    return read


def tool_schemas(env: Any) -> Any:
    """The tools an environment renders into every prompt (a verifiers ToolEnv's), if any; ``env`` is a
    LoadedEnv or a bare reward function."""
    return getattr(getattr(env, "source", None), "tool_schemas", None)
