"""The composition root: a :class:`~rlvr.cli.settings.RunConfig` becomes backends, seams and a loop.

The only place that picks backends (in-process engine or HTTP generator, which weight-sync lane,
which server). :func:`make_loop` reads the corpus once (:func:`task_tasks`), carves the split once
(:func:`rlvr.data.tasks.carve`), warm-starts the base on the training side only
(:mod:`rlvr.cli.warm_start`), builds the seams over one shared policy (:func:`build_seams`) and
hands the loop the same split. ``rlvr resume`` rebuilds the same seams from the folder's saved
config (:func:`saved_config`), over the base the run recorded or not at all (:mod:`rlvr.cli.base_trust`).

Run folder additions: ``config.json`` (the resolved RunConfig) and ``base/`` (the warm-started
base the adapter trains on), both written atomically before step 0.
Imports torch, transformers and peft (through the backends).
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import platform
import tempfile
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import peft
import torch
import transformers

from rlvr.algos import GRPO, OPD, OPSD, SFT, Algorithm, MaxRL, RawReward
from rlvr.backends.model.policy import LoraSpec, Policy
from rlvr.backends.model.tokenizer import HFChatTokenizer
from rlvr.backends.rollout.setup import rollout_fn_for
from rlvr.backends.sample.engine import InProcessEngine
from rlvr.backends.sample.gate import gate_for
from rlvr.backends.sync.in_process import InProcessLane
from rlvr.backends.track import open_sinks
from rlvr.backends.train.critic import CriticConfig, CriticTrainer
from rlvr.backends.train.distributed import Ranks, RankTrainer, current_ranks
from rlvr.backends.train.sharded import ShardedTrainer
from rlvr.backends.train.trainer import TorchTrainer
from rlvr.cli import cluster, ray_ranks, rollout_workers
from rlvr.cli import runs as earlier_runs
from rlvr.cli.adapter_init import inspect_adapter, load_adapter
from rlvr.cli.agents import agent_gateway, agent_of, agent_rollout_fn
from rlvr.cli.base_trust import base_fingerprint, base_source
from rlvr.cli.colocate import COLOCATED_HELDOUT, check_colocated, colocated_sampler_side, colocated_trainer
from rlvr.cli.cpu_waits import WAIT_POLICY
from rlvr.cli.eval_sets import eval_set_tasks
from rlvr.cli.fanout import pooled_sampler_side, several_servers, with_reward_workers
from rlvr.cli.fields import field_map
from rlvr.cli.levers import loss_config, lr_schedule, shaping, shown, shown_split
from rlvr.cli.lineage import check_lineage
from rlvr.cli.preflight import check_start
from rlvr.cli.reward_models import reward_loader
from rlvr.cli.run_folder import CONFIG_FILE, prepare_run_dir
from rlvr.cli.settings import AlgoSection, Endpoint, RunConfig, TaskSection, run_config_from_dict
from rlvr.cli.sharding import GatheringLane, ServedEvaluator, ServedVersionCheck, is_sharded, publishing_policy
from rlvr.cli.user_algos import custom_algorithm, echo_algorithm, loaded
from rlvr.cli.warm_start import BASE_DIR, prepare_base
from rlvr.cli.watchdog import make_watchdog
from rlvr.data.readers import read_tasks
from rlvr.data.tasks import carve, load_tasks
from rlvr.envs import environment, procedural_task
from rlvr.envs.graders.verifiers_adapter import is_verifiers_spec, verifiers_tasks
from rlvr.envs.loading import load_object
from rlvr.envs.trl import needs_answer, rewards_env
from rlvr.errors import ConfigError, RecordError, RecordWarning
from rlvr.lr_schedule import LRSchedule
from rlvr.rollouts.episodes import prompt_ids_of
from rlvr.run.evaluation import EnvsEvaluator, RolloutEvaluator
from rlvr.run.loop import EnvPlan, RLLoop
from rlvr.run.record import disk_errors, write_json_atomic
from rlvr.run.sinks import SampleSchedule
from rlvr.types import LoadedEnv, Progress, RolloutSetup, SamplingParams, Split, Task


def task_tasks(cfg: RunConfig) -> tuple[list[Task], LoadedEnv]:
    """The corpus, as tasks validated once, and the environment ``[task]`` names (see
    :class:`~rlvr.cli.settings.TaskSection`)."""
    return section_tasks(cfg.task, cfg.model.device)


def envs_tasks(cfg: RunConfig) -> tuple[list[Task], dict[str, LoadedEnv]]:
    """A run of several environments: every environment's rows, each tagged with its environment
    and its id prefixed by the environment's name (``addition/17``), so ids stay unique."""
    tasks: list[Task] = []
    envs: dict[str, LoadedEnv] = {}
    for name, section in cfg.envs.items():
        try:
            rows, envs[name] = section_tasks(section, cfg.model.device)
        except ConfigError as exc:
            raise ConfigError(f"[envs.{name}]: {exc}") from None
        tasks += [dataclasses.replace(t, id=f"{name}/{t.id}", env=name) for t in rows]
    return tasks, envs


def section_tasks(t: TaskSection, device: str = "cpu") -> tuple[list[Task], LoadedEnv]:
    """One environment's rows (``data``, else its own ``make_rows``, else the procedural task) and the
    environment itself (its ``rm:`` rewards on ``device``, the policy's)."""
    env = rewards_env(t.rewards, t.reward_weights, load=reward_loader(device)) if t.rewards else environment(
        t.env or t.name, **t.env_args)  # type: ignore[arg-type]
    if t.max_turns > 1 and not env.multi_turn and t.rollout is None:
        raise ConfigError(f"task.max_turns={t.max_turns} needs an environment with interact(); "
                          f"{env.name!r} has none")
    fields = field_map(t)
    if t.data is not None and is_verifiers_spec(t.data):
        if fields is not None:
            raise ConfigError(f"task.fields / task.answer_extract: rows from {t.data!r} come in the verifiers "
                              "environment's own shape; remove them")
        return verifiers_tasks(t.data, env), env
    if t.data is not None:  # prompt-only rows are fine for a reward that takes no answer (TRL's)
        return read_tasks(t.data, fields=fields, max_row_bytes=t.max_row_bytes(),
                          require_answer=needs_answer(env)), env
    make_rows = env.make_rows if t.env is not None and env.make_rows is not None else None
    if make_rows is None:
        if t.name is None:
            raise ConfigError(f"environment {env.name!r} makes no rows: set task.data or task.name")
        make_rows = procedural_task(t.name)[0]
    try:
        rows = make_rows(t.n, seed=t.seed, **t.params)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"task.params={t.params!r}: the rows of {t.name or env.name!r} cannot be made with them "
                          f"({exc})") from None
    return load_tasks(rows, fields=fields, require_answer=needs_answer(env)), env


def make_rollout_fn(task: TaskSection, setup: RolloutSetup) -> Any:
    """``task.agent``'s episodes, else ``task.rollout``'s factory, else multi-turn episodes when asked
    for, else one turn (the choice a remote rollout worker makes too, agents aside:
    :func:`~rlvr.backends.rollout.setup.rollout_fn_for`)."""
    agent = agent_of(task, setup.env)
    if agent is not None:
        return agent_rollout_fn(agent, setup)
    return rollout_fn_for(setup, rollout=task.rollout, max_turns=task.max_turns)


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


def check_prompts(split: Split, tokenizer: HFChatTokenizer, model_config: Any, max_new_tokens: int) -> None:
    """Refuse, at load, a row whose prompt the model cannot take: longer than its context with the
    completion budget added, or token ids outside its vocabulary. Never truncated silently."""
    context = int(getattr(model_config, "max_position_embeddings", 0) or 0)
    vocab = int(getattr(model_config, "vocab_size", 0) or 0)
    for side, tasks in (("training", split.train), ("held-out", split.heldout)):
        for task in tasks:
            ids = prompt_ids_of(task, tokenizer)
            if context and len(ids) + max_new_tokens > context:
                raise ConfigError(f"{side} row {task.id!r}: its prompt is {len(ids)} tokens, and with "
                                  f"sampler.max_new_tokens={max_new_tokens} that exceeds the model's context of "
                                  f"{context}; shorten the row, drop it from the data, or lower max_new_tokens")
            if vocab and max(ids) >= vocab:
                raise ConfigError(f"{side} row {task.id!r}: info.prompt_ids holds token id {max(ids)}, outside the "
                                  f"model's vocabulary of {vocab}")


def build_seams(cfg: RunConfig, base: Path, env: LoadedEnv | dict[str, LoadedEnv], run_dir: Path | None = None,
                split: Split | None = None, adapter: dict[str, Any] | None = None) -> dict[str, Any]:
    """Rollout functions, algorithms, trainer, weight sync and held-out evaluator around one policy;
    ``env`` is the run's environment, or name → environment in a run of several (``envs``). The
    returned ``closers`` stop engines, lanes, servers and teacher clients at exit. ``adapter`` (from
    :func:`~rlvr.cli.adapter_init.inspect_adapter`) is loaded into the policy before anything copies it."""
    policy = make_policy(cfg, base)
    if adapter is not None:
        load_adapter(policy, adapter)
    ranks = current_ranks()  # under torchrun: rank 0's trainer hands each call to the other ranks too
    trainer: Any = make_trainer(cfg, policy, ranks, lr_schedule(cfg, None if split is None else len(split.train)))
    if ranks is not None:
        trainer = ray_ranks.distributed(trainer, ranks)  # watched where the other ranks are Ray actors
    tokenizer = HFChatTokenizer(policy.tokenizer, template_kwargs=cfg.template_kwargs())
    if split is not None:
        check_prompts(split, tokenizer, policy.model.config, cfg.sampler.max_new_tokens)
    if cluster.on_ray(cfg):
        cluster.prepare(cfg)  # joined or started once, its placement sized for the whole run
    generator, weight_sync, closers = sampler_side(cfg, publishing_policy(trainer, policy), base, run_dir)
    colocated = cfg.sampler.backend == "vllm_colocate"
    if colocated:
        trainer = colocated_trainer(cfg, trainer, generator)  # on CUDA the engine sleeps while it trains
    if ranks is not None:
        closers.append(trainer.close)  # the other ranks stop with the run, however it ends
        if is_sharded(cfg):  # the lanes write from rank 0's copy, gathered before each publish
            weight_sync = GatheringLane(trainer, weight_sync)
    params = sampling_params(cfg, cfg.loop.temp)
    context = getattr(policy.model.config, "max_position_embeddings", None)
    envs = env if isinstance(env, dict) else {None: env}
    sections = {name: (cfg.envs[name] if name is not None else cfg.task) for name in envs}
    plans = {}
    try:
        envs = with_reward_workers(cfg, envs, closers)  # rewards in worker processes where a section asks
        fleet = rollout_workers.start(cfg, closers)  # rollouts in worker processes, when the cluster has them
        gateway = agent_gateway(cfg, envs, tokenizer, context, run_dir, closers)  # agents' recording proxy, if any
        for name, algo in cfg.algorithms().items():
            where = "algo" if name is None or cfg.envs[name].algo is None else f"envs.{name}.algo"
            source = algo.sampling.source
            sampler = frozen_generator(source, cfg, closers) if isinstance(source, Endpoint) else generator
            env_tokenizer = tokenizer.with_tools(tool_schemas(envs[name]))
            setup = RolloutSetup(generator=sampler, tokenizer=env_tokenizer, env=envs[name], params=params,
                                 extras={"agent_gateway": gateway, "agent_phase": "train"})
            if fleet is None:
                rollout_fn = make_rollout_fn(sections[name], setup)
            else:
                rollout_workers.check_remote(sections[name], agent_of(sections[name], envs[name]), name)
                rollout_fn = rollout_workers.remote_rollout_fn(fleet, cfg, sections[name], generator, base, params,
                                                               name)
            plans[name] = EnvPlan(envs[name], rollout_fn, build_algorithm(cfg, algo, where, generator, tokenizer,
                                                                          closers))
        served = None
        if is_sharded(cfg) or colocated:  # held-out on the servers or the engine, from the trainer's version only
            served = ServedVersionCheck(generator, lambda: trainer.version,
                                        **({"hint": COLOCATED_HELDOUT} if colocated else {}))
        heldout = heldout_evaluator(cfg, policy, tokenizer, envs, closers, generator=served)
        if served is not None:
            heldout = ServedEvaluator(heldout, served)
    except BaseException:
        for close in closers:
            close()
        raise
    return {"plans": plans, "trainer": trainer, "weight_sync": weight_sync, "heldout_eval": heldout,
            "policy": policy, "closers": closers, "gauges": generation_gauges(policy)}


def _once(close: Callable[[], None]) -> Callable[[], None]:
    """``close``, doing its work on the first call only (the loop's and atexit's calls meet here)."""
    first = threading.Lock()  # taken by the first call, never released

    def call() -> None:
        if first.acquire(blocking=False):
            close()

    call.__qualname__ = getattr(close, "__qualname__", "close")
    return call


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


def make_policy(cfg: RunConfig, base: Path, *, need_reference: bool | None = None) -> Policy:
    """The run's policy on ``base`` (LoRA or full weights, as configured), at version 0."""
    lora = LoraSpec(rank=cfg.loop.lora_rank, alpha=cfg.train.lora_alpha, targets=tuple(cfg.train.lora_targets))
    return Policy(str(base), lora=lora, dtype=cfg.model.dtype, device=cfg.model.device,
                  reference_on_cpu=cfg.train.reference_on_cpu,
                  need_reference=cfg.loop.kl_coef > 0 if need_reference is None else need_reference,
                  seed=cfg.loop.seed)


def make_trainer(cfg: RunConfig, policy: Policy, ranks: Ranks | None = None,
                 schedule: LRSchedule | None = None) -> TorchTrainer:
    """The run's trainer over ``policy``; its ``load`` restores a checkpoint's weights, version and
    learning-rate schedule. With ``ranks`` (a data-parallel group), this rank's part of the group's
    trainer. ``schedule``: the run's (:func:`lr_schedule`); default: over ``loop.max_steps``."""
    cls: Any = TorchTrainer if ranks is None else ShardedTrainer if is_sharded(cfg) else RankTrainer
    t = cfg.train
    settings = dict(loss=loss_config(cfg), lr=cfg.loop.lr, weight_decay=t.weight_decay,
                    max_grad_norm=t.max_grad_norm, temperature=cfg.loop.temp, max_nonfinite=t.max_nonfinite,
                    micro_batch=t.micro_batch, ppo_n_minibatches=t.ppo_n_minibatches, autocast=t.autocast,
                    packing=t.packing, share_prompts=t.share_prompts, update_epochs=t.update_epochs,
                    lr_schedule=schedule or lr_schedule(cfg), gradient_checkpointing=t.gradient_checkpointing,
                    memory_budget_frac=t.memory_budget_frac, memory_floor_frac=memory_floor(cfg),
                    release_freed_memory=t.release_freed_memory,
                    log=print if ranks is None or ranks.rank == 0 else None)
    if cfg.uses_critic():  # a value head on the policy's body (backends/train/critic.py)
        check_critic(cfg, ranks)
        return CriticTrainer(policy, critic=CriticConfig(**cfg.critic.model_dump()), **settings)
    if cls is ShardedTrainer and t.tensor_parallel > 1:  # a 2-D mesh: tensor slices beside FSDP2's shards
        from rlvr.backends.train.tensor_parallel import TensorParallelTrainer

        return TensorParallelTrainer(policy, tensor_parallel=t.tensor_parallel, **settings)
    return cls(policy, **settings)


def memory_floor(cfg: RunConfig) -> float:
    """The share of system memory the micro-batch sizer leaves free: the memory watchdog's floor, where it watches."""
    return (cfg.watchdog.floor_available_frac or 0.0) if cfg.watchdog.enabled else 0.0


def check_critic(cfg: RunConfig, ranks: Ranks | None) -> None:
    """A critic trains in one trainer process: refused under trainer ranks (each would train its own head)."""
    if cfg.uses_critic() and ranks is not None:
        raise ConfigError(f"loop.advantage = 'gae' trains a critic (a value head) in the trainer's process, and this "
                          f"run has {ranks.world_size} trainer ranks, whose heads would drift apart: run it with one "
                          "trainer process (no --nproc), or pick another loop.advantage")


def sampling_params(cfg: RunConfig, temperature: float) -> SamplingParams:
    """``[sampler]``'s sampling at ``temperature``; greedy (0) takes none of the knobs, so a greedy
    held-out score stays a property of the weights alone."""
    s = cfg.sampler
    if temperature == 0:
        return SamplingParams(max_tokens=s.max_new_tokens, temperature=0.0)
    return SamplingParams(max_tokens=s.max_new_tokens, temperature=temperature, top_p=s.top_p, top_k=s.top_k,
                          min_p=s.min_p, repetition_penalty=s.repetition_penalty)


def heldout_evaluator(cfg: RunConfig, policy: Policy, tokenizer: HFChatTokenizer, envs: dict[str | None, LoadedEnv],
                      closers: list[Callable[[], None]], *, temperature: float | None = None,
                      seed_offset: int = 0, generator: Any = None) -> Any:
    """Held-out episodes, played by each environment's own rollout function on the live weights
    (greedy: ``sampler.heldout_temperature``, unless ``temperature`` is given); ``seed_offset``
    gives a sampled evaluation draws of its own (``rlvr eval``'s sample j). ``generator``: play them
    there instead (the servers, under sharded ranks: :mod:`rlvr.cli.sharding`)."""
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
        section = cfg.envs[name] if name is not None else cfg.task
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
    from rlvr.backends.sample.http import HTTPGenerator
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
    generator = HTTPGenerator(s.url or "http://127.0.0.1:1", s.served_model_name, max_concurrency=s.max_concurrency,
                              timeout_s=s.timeout_s, retries=s.retries)  # a started server's url is set below
    if s.url is None:
        server = make_server(cfg, policy, base, folder / "server.log", sync_dir, keep)
        generator.diagnose = server.exit_report
    if lane == "kill_restart":
        if s.url is not None:
            raise ConfigError("sampler.lane = 'kill_restart' starts its own server: leave sampler.url unset")
        publish = lanes.KillRestartLane(policy, sync_dir, base_model_dir=base, keep=keep, generator=generator,
                                        server=server, **common)  # the lane points the generator at it
        return generator, publish, [publish.close]
    closers: list[Callable[[], None]] = []
    if server is not None:
        server.start()
        closers.append(server.stop)
        generator.url = server.url
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
        kwargs = {"python": python, "dtype": cfg.model.dtype, "lora_rank": cfg.loop.lora_rank, "max_loras": keep,
                  "seed": cfg.loop.seed, "kv_cache_gib": s.vllm_kv_cache_gib, "vllm_args": s.vllm_args, **common}
        factory: Any = VLLMServer
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


def _versions() -> dict[str, str]:
    return {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__,
            "python": platform.python_version()}


def make_loop(cfg: RunConfig, run_dir: Path, *, progress_cb: Callable[[Progress], None] | None = None,
              log: Callable[[str], None] = print) -> RLLoop:
    """Everything up to ``RLLoop.run``: config saved, base ready, seams built."""
    if cfg.model.threads:
        torch.set_num_threads(cfg.model.threads)
    # Every refusal (config, data, corpus floor, filter) comes before anything is written to run_dir.
    loss_config(cfg)
    if cfg.envs:
        tasks, envs = envs_tasks(cfg)
        env: Any = envs
    else:
        tasks, env = task_tasks(cfg)
    split = shown_split(cfg, carve(tasks, cfg.loop.heldout_frac, cfg.loop.split_salt, cfg.loop.corpus_min))
    lr_schedule(cfg, len(split.train))  # a warmup longer than the run is refused before anything is written
    run_shaping = shaping(cfg)
    answers = any(needs_answer(e) for e in (env.values() if isinstance(env, dict) else [env]))
    eval_sets, eval_info = eval_set_tasks(cfg, split, require_answer=answers)
    eval_sets = {name: shown(cfg, tasks) for name, tasks in eval_sets.items()}
    start = check_lineage(cfg, split)  # a base or adapter trained on held-out rows: refused here, unless allowed
    for name, seen in eval_info.items():
        if seen["in_train"]:
            log(f"eval set {name!r}: {seen['in_train']} of its {seen['n']} rows are also training rows (same "
                "content); they are scored as given, and run.json counts them under eval_sets")
    dynamic_filter = None
    filters = [(f"envs.{n}", e.dynamic_filter) for n, e in cfg.envs.items() if e.dynamic_filter]
    if filters:
        raise ConfigError(f"{filters[0][0]}.dynamic_filter: a run of several environments has one filter for every "
                          "row; set loop.filter_zero_variance, or run the environments separately")
    if cfg.task.dynamic_filter is not None and not cfg.envs:
        dynamic_filter = load_object(cfg.task.dynamic_filter)
        if not callable(dynamic_filter):
            raise ConfigError(f"task.dynamic_filter={cfg.task.dynamic_filter!r} is not a function of a group")
    check_algorithms(cfg)
    check_colocated(cfg, current_ranks())
    check_critic(cfg, current_ranks())
    # A resumed run's weights come from its checkpoint: the adapter it started from is history then.
    resuming = (run_dir / "run.json").exists()
    adapter = inspect_adapter(cfg) if not resuming else None
    check_start(cfg, split)  # the model, the device, the warm start: checked before anything is written
    if not resuming:  # has this been tried? said, never refused
        earlier_runs.before_start(cfg, split, run_dir, log)
    prepare_run_dir(run_dir)
    with disk_errors(f"{run_dir / CONFIG_FILE}"):
        write_json_atomic(run_dir / CONFIG_FILE, cfg.model_dump(mode="json"))
    source = base_source(cfg, run_dir, log)
    base = prepare_base(cfg, run_dir, split, env, log, source)
    weights = base_fingerprint(cfg, run_dir, base, log)  # a resume over a changed base folder: refused here
    start.write(run_dir, base)  # what a later run started from this one's folders is checked against
    seams = build_seams(cfg, base, env, run_dir, split, adapter)
    closers = [_once(close) for close in seams["closers"]]
    for close in closers:  # the loop stops them when run() ends; atexit if it never runs
        atexit.register(close)  # engines, lanes, servers: stopped before the interpreter tears torch down
    sinks = open_sinks(cfg.log.sinks, run_dir, project=cfg.log.project, run_name=cfg.log.run_name or run_dir.name,
                       warn=log, wandb_mode=cfg.log.wandb_mode, wandb_entity=cfg.log.wandb_entity)
    info = {"versions": _versions(), "cpu_threads": {"torch": torch.get_num_threads(),
                                                     "omp_wait_policy": os.environ.get(WAIT_POLICY, "unset")},
            "task": cfg.task.model_dump(mode="json"),
            "run_config": cfg.model_dump(mode="json"), "sinks": ["jsonl"] + [s.name for s in sinks],
            "base_folder": BASE_DIR if base == run_dir / BASE_DIR else str(base),
            **({"base_source": source.describe()} if source is not None else {}),
            **({"base_fingerprint": weights} if weights is not None else {}),
            "run_config_sha256": cfg.digest(), **({"adapter_init": adapter} if adapter is not None else {}),
            **({"eval_sets": eval_info} if eval_info else {}), "cluster": cluster.cluster_record(cfg),
            **start.run_info()}
    plans = seams["plans"]
    common = {"trainer": seams["trainer"], "heldout_eval": seams["heldout_eval"],
              "weight_sync": seams["weight_sync"], "out_dir": run_dir, "progress_cb": progress_cb, "run_info": info,
              "watchdog": make_watchdog(cfg, log), "eval_sets": eval_sets,
              "sinks": sinks, "samples": SampleSchedule(cfg.log.log_samples_every, cfg.log.samples_per_step),
              "shaping": run_shaping, "log": log, "gauges": seams["gauges"], "closers": closers}
    if cfg.envs:
        info["envs"] = {name: section.model_dump(mode="json") for name, section in cfg.envs.items()}
        return RLLoop(cfg.loop, None, split, envs=plans, **common)
    plan = plans[None]
    return RLLoop(cfg.loop, plan.reward, split, rollout_fn=plan.rollout_fn, algorithm=plan.algorithm,
                  dynamic_filter=dynamic_filter, **common)


def saved_config(run_dir: Path) -> RunConfig:
    """The config a run folder was started with: ``config.json``, or, where that file is damaged, the
    same config as run.json records it (``run_config``)."""
    path = run_dir / CONFIG_FILE
    if not path.exists():
        raise RecordError(f"{run_dir}: no {CONFIG_FILE}; is this an rlvr run folder?")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        data = _recorded_config(run_dir)
        if data is None:
            raise RecordError(f"{path} cannot be read ({type(exc).__name__}: {exc}) and run.json records no "
                              "config to rebuild it from") from None
        warnings.warn(f"{path} cannot be read ({type(exc).__name__}); rebuilt from run.json", RecordWarning,
                      stacklevel=2)
        write_json_atomic(path, data)
    if not isinstance(data, dict):
        raise RecordError(f"{path} does not hold a JSON object")
    return run_config_from_dict(data, str(path))


def _recorded_config(run_dir: Path) -> dict[str, Any] | None:
    try:
        recorded = json.loads((run_dir / "run.json").read_text(encoding="utf-8")).get("run_config")
    except (OSError, ValueError, AttributeError):
        return None
    return recorded if isinstance(recorded, dict) else None
