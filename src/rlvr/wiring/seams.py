"""The composition root: a :class:`~rlvr.config.run.RunConfig` becomes backends, seams and a loop.

The only place that picks backends (in-process engine or HTTP generator, which weight-sync lane,
which server). :func:`make_loop` reads the corpus once (:func:`task_tasks`), carves the split once
(:func:`rlvr.data.tasks.carve`), warm-starts the base on the training side only
(:mod:`rlvr.wiring.base`), builds the seams over one shared policy (:func:`build_seams`) and
hands the loop the same split. ``rlvr resume`` rebuilds the same seams from the folder's saved
config (:func:`saved_config`), over the base the run recorded or not at all (:mod:`rlvr.wiring.base_trust`).

Run folder additions: ``config.json`` (the resolved RunConfig) and ``base/`` (the warm-started
base the adapter trains on), both written atomically before step 0.
Imports torch, transformers and peft (through the backends).
"""

from __future__ import annotations

import atexit
import json
import os
import platform
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import peft
import torch
import transformers

from rlvr.backends.model.policy import Policy
from rlvr.backends.model.tokenizer import HFChatTokenizer
from rlvr.backends.track import open_sinks
from rlvr.backends.train.distributed import current_ranks
from rlvr.config.algo_section import Endpoint
from rlvr.config.loop import engine_windows, outside_windows
from rlvr.config.run import RunConfig, run_config_from_dict
from rlvr.errors import RecordError, RecordWarning
from rlvr.protocols import HeldoutEvaluator, LoadedEnv, RolloutSetup, Trainer, WeightSync
from rlvr.record.run_folder import CONFIG_FILE, prepare_run_dir
from rlvr.record.run_record import disk_errors, write_json_atomic
from rlvr.record.sinks import SampleSchedule
from rlvr.run.inputs import EnvPlan, LoopOptions, LoopSeams
from rlvr.run.loop import RLLoop
from rlvr.types import Progress
from rlvr.wiring import runs as earlier_runs
from rlvr.wiring.adapter_init import load_adapter
from rlvr.wiring.agents import agent_gateway, agent_of
from rlvr.wiring.algorithms import build_algorithm, frozen_generator
from rlvr.wiring.base import BASE_DIR, prepare_base
from rlvr.wiring.base_trust import base_fingerprint, base_source
from rlvr.wiring.cpu_waits import WAIT_POLICY
from rlvr.wiring.levers import lr_schedule
from rlvr.wiring.plan import RunPlan, plan_run
from rlvr.wiring.sampler import generation_gauges, heldout_evaluator, sampler_side, sampling_params, tool_schemas
from rlvr.wiring.scale import cluster, ray_ranks, rollout_workers
from rlvr.wiring.scale.colocate import COLOCATED_HELDOUT, colocated_trainer
from rlvr.wiring.scale.fanout import with_reward_workers
from rlvr.wiring.scale.sharding import GatheringLane, ServedEvaluator, ServedVersionCheck, is_sharded, publishing_policy
from rlvr.wiring.tasks import check_prompts, data_source, make_rollout_fn
from rlvr.wiring.trainer import make_policy, make_trainer
from rlvr.wiring.watchdog import make_watchdog


@dataclass(frozen=True)
class BuiltSeams:
    """What :func:`build_seams` built around one policy: each environment's plan (reward, rollout
    function, algorithm), the trainer, weight sync, the held-out evaluator, the policy itself, what
    stops it all (``closers``) and the backends' gauges."""

    envs: dict[str | None, EnvPlan]
    trainer: Trainer
    weight_sync: WeightSync | None
    heldout_eval: HeldoutEvaluator
    policy: Policy
    closers: list[Callable[[], None]]
    gauges: Callable[[], Mapping[str, float]]


def build_seams(plan: RunPlan, base: Path, run_dir: Path | None = None) -> BuiltSeams:
    """Rollout functions, algorithms, trainer, weight sync and held-out evaluator around one policy,
    for ``plan``'s environments (name → environment, ``{None: env}`` for a run of one), split, loss
    and schedule. The returned ``closers`` stop engines, lanes, servers and teacher clients at exit.
    The plan's ``adapter`` (:func:`~rlvr.wiring.adapter_init.inspect_adapter`) is loaded into the
    policy before anything copies it."""
    cfg, envs, split = plan.cfg, plan.envs, plan.split
    policy = make_policy(cfg, base)
    if plan.adapter is not None:
        load_adapter(policy, plan.adapter)
    ranks = current_ranks()  # under torchrun: rank 0's trainer hands each call to the other ranks too
    schedule = plan.schedule or lr_schedule(cfg, None if split is None else len(split.train))
    trainer: Any = make_trainer(cfg, policy, ranks, schedule, run_dir, loss=plan.loss)
    if ranks is not None:
        trainer = ray_ranks.distributed(trainer, ranks)  # watched where the other ranks are Ray actors
    tokenizer = HFChatTokenizer(policy.tokenizer, template_kwargs=cfg.template_kwargs())
    if split is not None:
        check_prompts(split, tokenizer, policy.model.config, cfg.completion_budget)
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
    closers.extend(env_closers(envs.values()))  # hub workers and their episode programs stop with the run
    sections = cfg.env_sections()
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
    return BuiltSeams(plans, trainer, weight_sync, heldout, policy, closers, generation_gauges(policy))


def env_closers(envs: Iterable[Any]) -> list[Callable[[], None]]:
    """``close`` of every environment rlvr built from a spec that has one (a hub environment's worker,
    with its episode programs): what the run started, it stops. Objects the caller built and handed
    over (``rlvr.train``'s callables) are the caller's to close."""
    return [close for e in envs if getattr(e, "spec", None) is not None
            and callable(close := getattr(getattr(e, "source", None), "close", None))]


def _once(close: Callable[[], None]) -> Callable[[], None]:
    """``close``, doing its work on the first call only (the loop's and atexit's calls meet here)."""
    first = threading.Lock()  # taken by the first call, never released

    def call() -> None:
        if first.acquire(blocking=False):
            close()

    call.__qualname__ = getattr(close, "__qualname__", "close")
    return call


def _versions() -> dict[str, str]:
    return {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__,
            "python": platform.python_version()}


def make_loop(cfg: RunConfig, run_dir: Path, *, progress_cb: Callable[[Progress], None] | None = None,
              log: Callable[[str], None] = print) -> RLLoop:
    """Everything up to ``RLLoop.run``: the run planned (every refusal), config saved, base ready,
    seams built."""
    if cfg.model.threads:
        torch.set_num_threads(cfg.model.threads)
    plan = plan_run(cfg, run_dir, log)  # every refusal comes before anything is written to run_dir
    split = plan.split
    assert split is not None and plan.lineage is not None  # plan_run carves the split and checks the lineage
    if not plan.resuming:  # has this been tried? said, never refused
        earlier_runs.before_start(cfg, split, run_dir, log)
    prepare_run_dir(run_dir)
    with disk_errors(f"{run_dir / CONFIG_FILE}"):
        write_json_atomic(run_dir / CONFIG_FILE, cfg.model_dump(mode="json"))
    source = base_source(cfg, run_dir, log)
    base = prepare_base(cfg, run_dir, split, plan.envs, log, source)
    weights = base_fingerprint(cfg, run_dir, base, log)  # a resume over a changed base folder: refused here
    plan.lineage.write(run_dir, base)  # what a later run started from this one's folders is checked against
    seams = build_seams(plan, base, run_dir)
    closers = [_once(close) for close in seams.closers]
    for close in closers:  # the loop stops them when run() ends; atexit if it never runs
        atexit.register(close)  # engines, lanes, servers: stopped before the interpreter tears torch down
    windows = engine_windows(_versions())
    for warning in outside_windows(windows):  # validated, not required: said, never refused
        log(f"warning: {warning}")
    sinks = open_sinks(cfg.log.sinks, run_dir, project=cfg.log.project, run_name=cfg.log.run_name or run_dir.name,
                       warn=log, wandb_mode=cfg.log.wandb_mode, wandb_entity=cfg.log.wandb_entity)
    info = _run_info(plan, run_dir, base, source, weights, windows, [s.name for s in sinks])
    loop_seams = LoopSeams(seams.envs, seams.trainer, seams.heldout_eval, seams.weight_sync, plan.dynamic_filter,
                           seams.gauges, closers)
    options = LoopOptions(out_dir=run_dir, progress_cb=progress_cb, watchdog=make_watchdog(cfg, log), run_info=info,
                          sinks=sinks, samples=SampleSchedule(cfg.log.log_samples_every, cfg.log.samples_per_step),
                          shaping=plan.shaping, log=log, eval_sets=plan.eval_sets)
    return RLLoop(cfg.loop, split, loop_seams, options)


def _run_info(plan: RunPlan, run_dir: Path, base: Path, source: Any, weights: Any, windows: Any,
              sinks: list[str]) -> dict[str, Any]:
    """What the composition root adds to run.json: versions, threads, the task and data source, the
    resolved config, sinks, the base (folder, source, fingerprint), adapter, eval sets, cluster,
    lineage, and in a run of several environments their sections."""
    cfg = plan.cfg
    assert plan.lineage is not None
    info = {"versions": _versions(), "engine_windows": windows, "cpu_threads": {"torch": torch.get_num_threads(),
                                                     "omp_wait_policy": os.environ.get(WAIT_POLICY, "unset")},
            "task": cfg.task.model_dump(mode="json"), "data_source": _data_sources(cfg, plan.envs),
            "run_config": cfg.model_dump(mode="json"), "sinks": ["jsonl"] + sinks,
            "base_folder": BASE_DIR if base == run_dir / BASE_DIR else str(base),
            **({"base_source": source.describe()} if source is not None else {}),
            **({"base_fingerprint": weights} if weights is not None else {}),
            "run_config_sha256": cfg.digest(), **({"adapter_init": plan.adapter} if plan.adapter is not None else {}),
            **({"eval_sets": plan.eval_info} if plan.eval_info else {}), "cluster": cluster.cluster_record(cfg),
            **plan.lineage.run_info()}
    if cfg.envs:
        info["envs"] = {name: section.model_dump(mode="json") for name, section in cfg.envs.items()}
    return info


def _data_sources(cfg: RunConfig, envs: Mapping[str | None, LoadedEnv]) -> str | dict[str, str]:
    """Where the rows came from (``data_source`` in run.json; the model card names the data so): one
    line for a run of one environment, name → line for several."""
    sources = {name: data_source(section, envs[name]) for name, section in cfg.env_sections().items()}
    return sources[None] if None in sources else {str(name): line for name, line in sources.items()}


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
