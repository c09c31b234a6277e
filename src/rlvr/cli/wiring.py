"""A whole run from a :class:`~rlvr.cli.settings.RunConfig`: base model → warm start → RL → record.

``train`` builds (or loads) the base, warm-starts it on the *training* split only (the held-out
split is carved first and never seen), builds the in-process seams over one shared policy, and
runs :class:`~rlvr.RLLoop` into the run folder. ``resume`` rebuilds the same seams from the
folder's saved config and continues. ``export`` writes the selected checkpoint as a PEFT adapter
and as a merged Hugging Face model.

Run folder additions: ``config.json`` (the resolved RunConfig) and ``base/`` (the warm-started
base the adapter trains on), both written atomically before step 0.
A backend module: imports torch, transformers and peft.
"""

from __future__ import annotations

import atexit
import json
import platform
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import peft
import torch
import transformers

from rlvr.backends.model.io import load_model, load_tokenizer
from rlvr.backends.model.policy import LoraSpec, Policy
from rlvr.backends.model.tiny import build_tiny_model
from rlvr.backends.model.tokenizer import HFChatTokenizer
from rlvr.backends.sample.engine import InProcessEngine
from rlvr.backends.sync.in_process import InProcessLane
from rlvr.backends.train.losses import LossConfig
from rlvr.backends.train.sft import greedy_accuracy, sft_warm_start
from rlvr.backends.train.trainer import TorchTrainer
from rlvr.cli.settings import RunConfig, run_config_from_dict
from rlvr.data.readers import load_rows
from rlvr.data.tasks import load_tasks, split_tasks
from rlvr.envs import environment, procedural_task
from rlvr.envs.loading import load_object
from rlvr.errors import ConfigError, RLLoopError
from rlvr.reward import evaluate_reward
from rlvr.rollouts.episodes import multi_turn, single_turn
from rlvr.run.evaluation import RolloutEvaluator
from rlvr.run.loop import RLLoop
from rlvr.run.record import read_record, write_json_atomic
from rlvr.types import LoadedEnv, Progress, RolloutSetup, SamplingParams

CONFIG_FILE = "config.json"
BASE_DIR = "base"
BASE_MARKER = "rlvr_base.json"


def task_rows(cfg: RunConfig) -> tuple[list[dict[str, Any]], LoadedEnv]:
    """The corpus and the environment ``[task]`` names (see :class:`~rlvr.cli.settings.TaskSection`)."""
    t = cfg.task
    env = environment(t.env or t.name, **t.env_args)  # type: ignore[arg-type]
    if t.max_turns > 1 and not env.multi_turn and t.rollout is None:
        raise ConfigError(f"task.max_turns={t.max_turns} needs an environment with interact(); "
                          f"{env.name!r} has none")
    if t.data is not None:
        return load_rows(t.data), env
    make_rows = env.make_rows if t.env is not None and env.make_rows is not None else None
    if make_rows is None:
        if t.name is None:
            raise ConfigError(f"environment {env.name!r} makes no rows: set task.data or task.name")
        make_rows = procedural_task(t.name)[0]
    return make_rows(t.n, seed=t.seed, **t.params), env


def reward_value(env: LoadedEnv) -> Callable[[list[dict[str, Any]], Any], float]:
    """The environment's reward as a plain float (0 where it does not apply), for SFT checks."""
    return lambda messages, answer: evaluate_reward(env, messages, answer).value or 0.0


def prepare_base(cfg: RunConfig, run_dir: Path, rows: list[dict[str, Any]], env: LoadedEnv,
                 log: Callable[[str], None]) -> Path:
    """The folder the policy starts from: ``loop.base`` as is, or a built tiny model, warm-started
    (``env`` scores the warm start's accuracy checks)."""
    base = run_dir / BASE_DIR
    recipe = base_recipe(cfg)
    if base.exists():
        marker = base / BASE_MARKER
        found = json.loads(marker.read_text()) if marker.exists() else None
        if found != recipe:
            raise ConfigError(f"{base} was built for another model/task/split/warm-start config; "
                              "remove it or use another run folder")
        return base
    tmp = run_dir / (BASE_DIR + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    if cfg.model.tiny:
        m = cfg.model
        build_tiny_model(tmp, hidden=m.hidden, layers=m.layers, heads=m.heads, seed=m.init_seed)
        source = str(tmp)
    elif cfg.loop.base:
        source = cfg.loop.base
    else:
        raise RLLoopError("set loop.base to a model name or folder, or model.tiny = true")
    if cfg.sft.steps == 0 and not cfg.model.tiny:
        return Path(source)  # nothing to change: train on the given base directly
    model = load_model(source, dtype=cfg.model.dtype, device=cfg.model.device)
    tokenizer = load_tokenizer(source)
    if cfg.sft.steps:
        stats = warm_start(cfg, model, tokenizer, rows, env, log)
        log(f"warm start: {stats['steps']} steps, loss {stats['loss_start']:.3f} -> {stats['loss']:.3f} "
            f"in {stats['seconds']:.1f}s" + (f", train accuracy {stats['accuracy']:.3f}" if "accuracy" in stats else ""))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / BASE_MARKER).write_text(json.dumps(recipe, sort_keys=True))
    tmp.rename(base)
    return base


def base_recipe(cfg: RunConfig) -> dict[str, Any]:
    """Everything that shapes the warm-started base, the held-out split included."""
    loop = cfg.loop
    return {"model": cfg.model.model_dump(mode="json", exclude={"threads", "device"}),
            "task": cfg.task.model_dump(mode="json"), "sft": cfg.sft.model_dump(mode="json"),
            "base": loop.base, "seed": loop.seed, "heldout_frac": loop.heldout_frac,
            "split_salt": loop.split_salt, "max_new_tokens": cfg.sampler.max_new_tokens}


def warm_start(cfg: RunConfig, model: Any, tokenizer: Any, rows: list[dict[str, Any]], env: LoadedEnv,
               log: Callable[[str], None]) -> dict[str, Any]:
    """SFT on the training split only; the held-out split is carved first and never seen."""
    train, _ = split_tasks(load_tasks(rows), cfg.loop.heldout_frac, cfg.loop.split_salt)
    sft_rows = [{"prompt": list(t.messages), "answer": str(t.answer)} for t in train]
    reward_fn = reward_value(env)
    check = sft_rows[: cfg.sft.check_rows]
    stop_when, accuracy = None, {}
    if cfg.sft.target_accuracy is not None:
        def stop_when() -> bool:
            accuracy["value"] = greedy_accuracy(model, tokenizer, check, reward_fn,
                                                max_new_tokens=cfg.sampler.max_new_tokens)
            return accuracy["value"] >= cfg.sft.target_accuracy
    log(f"warm start: up to {cfg.sft.steps} SFT steps on {len(sft_rows)} training rows"
        + (f", until train accuracy >= {cfg.sft.target_accuracy}" if stop_when else ""))
    stats = sft_warm_start(model, tokenizer, sft_rows, steps=cfg.sft.steps, batch_size=cfg.sft.batch_size,
                           lr=cfg.sft.lr, seed=cfg.loop.seed, stop_when=stop_when, check_every=cfg.sft.check_every)
    return {**stats, **({"accuracy": accuracy["value"]} if accuracy else {})}


def loss_config(cfg: RunConfig) -> LossConfig:
    """The trainer's loss settings; a bad combination fails naming the ``train.`` key."""
    t = cfg.train
    try:
        return LossConfig(policy_loss=t.policy_loss, aggregation=t.aggregation,
                          constant_normaliser=t.constant_normaliser, kl_coef=cfg.loop.kl_coef,
                          kl_estimator=t.kl_estimator, entropy_coef=t.entropy_coef, tis_cap=t.tis_cap)
    except ValueError as exc:
        raise ConfigError(f"[train]: {str(exc).replace('LossConfig.', 'train.')}") from None


def make_rollout_fn(cfg: RunConfig, setup: RolloutSetup) -> Any:
    """``task.rollout``'s factory, else multi-turn episodes when asked for, else one turn."""
    t = cfg.task
    if t.rollout is not None:
        factory = load_object(t.rollout)
        if not callable(factory):
            raise ConfigError(f"task.rollout={t.rollout!r} is not a make_rollout_fn(setup) factory")
        fn = factory(setup)
        if not callable(fn):
            raise ConfigError(f"task.rollout={t.rollout!r} returned {type(fn).__name__}, not a rollout function")
        return fn
    if t.max_turns > 1:
        return multi_turn(setup, max_turns=t.max_turns)
    return single_turn(setup)


def build_seams(cfg: RunConfig, base: Path, env: LoadedEnv, run_dir: Path | None = None) -> dict[str, Any]:
    """Rollout function, trainer, weight sync and held-out evaluator around one policy; the
    returned ``closers`` stop engines, lanes and servers at exit."""
    lora = LoraSpec(rank=cfg.loop.lora_rank, alpha=cfg.train.lora_alpha, targets=tuple(cfg.train.lora_targets))
    policy = Policy(str(base), lora=lora, dtype=cfg.model.dtype, device=cfg.model.device,
                    reference_on_cpu=cfg.train.reference_on_cpu, need_reference=cfg.loop.kl_coef > 0,
                    seed=cfg.loop.seed)
    loss = loss_config(cfg)
    s = cfg.sampler
    trainer = TorchTrainer(policy, loss=loss, lr=cfg.loop.lr, weight_decay=cfg.train.weight_decay,
                           max_grad_norm=cfg.train.max_grad_norm, temperature=cfg.loop.temp,
                           max_nonfinite=cfg.train.max_nonfinite, micro_batch=cfg.train.micro_batch,
                           ppo_n_minibatches=cfg.train.ppo_n_minibatches)
    generator, weight_sync, closers = sampler_side(cfg, policy, base, run_dir)
    tokenizer = HFChatTokenizer(policy.tokenizer)
    setup = RolloutSetup(generator=generator, tokenizer=tokenizer, env=env,
                         params=SamplingParams(max_tokens=s.max_new_tokens, temperature=cfg.loop.temp, top_p=s.top_p))
    # Held-out episodes are played by the same rollout function, greedily, on the live weights.
    live = InProcessEngine(policy.model, eos_ids=policy.eos_ids, pad_id=policy.tokenizer.pad_token_id,
                           version=lambda: policy.version, name="rlvr-heldout")
    greedy = RolloutSetup(generator=live, tokenizer=tokenizer, env=env,
                          params=SamplingParams(max_tokens=s.max_new_tokens, temperature=s.heldout_temperature))
    heldout = RolloutEvaluator(make_rollout_fn(cfg, greedy), env, seed=cfg.loop.seed + 1)
    return {"rollout_fn": make_rollout_fn(cfg, setup), "trainer": trainer, "weight_sync": weight_sync,
            "heldout_eval": heldout, "policy": policy, "closers": [*closers, live.close]}


def sampler_side(cfg: RunConfig, policy: Policy, base: Path,
                 run_dir: Path | None) -> tuple[Any, Callable[[int], int] | None, list[Callable[[], None]]]:
    """The training generator, the lane that brings it new weights, and what to close at exit."""
    s = cfg.sampler
    if s.backend == "in_process":
        engine, weight_sync = rollout_engine(cfg, policy)
        return engine, weight_sync, [engine.close]
    from rlvr.backends.sample.http import HTTPGenerator
    from rlvr.backends.serve.process import ServerProcess
    from rlvr.backends.sync import lanes  # httpx: only for the HTTP path

    lane = s.lane if s.lane != "auto" else ("lora_hot_load" if policy.is_lora else "disk_reload")
    sync_dir = (run_dir if run_dir is not None else Path(tempfile.mkdtemp(prefix="rlvr-sync-"))) / "sync"
    # In-flight requests may still name the adapters of the last O versions: keep those loaded.
    keep = cfg.loop.max_head_offpolicy_versions + 2
    common = {"compatible": s.server_compatible, "verify": s.verify_version}
    closers: list[Callable[[], None]] = []
    if lane == "kill_restart":
        if s.url is not None:
            raise ConfigError("sampler.lane = 'kill_restart' starts its own server: leave sampler.url unset")
        generator = HTTPGenerator("http://127.0.0.1:1", s.served_model_name, max_concurrency=s.max_concurrency,
                                  timeout_s=s.timeout_s, retries=s.retries)  # the lane points it at the server
        publish = lanes.KillRestartLane(policy, sync_dir, base_model_dir=base, served_model_name=s.served_model_name,
                                        serve_command=s.serve_command, stop_command=s.stop_command, keep=keep,
                                        generator=generator, device=cfg.model.device, threads=s.server_threads,
                                        **common)
        return generator, publish, [publish.close]
    url = s.url
    if url is None:
        server = ServerProcess(base, served_model_name=s.served_model_name, threads=s.server_threads,
                               device=cfg.model.device, command=s.serve_command, stop_command=s.stop_command)
        server.start()
        closers.append(server.stop)
        url = server.url
    generator = HTTPGenerator(url, s.served_model_name, max_concurrency=s.max_concurrency, timeout_s=s.timeout_s,
                              retries=s.retries)
    if lane == "lora_hot_load":
        publish = lanes.LoraHotLoadLane(policy, url, sync_dir, keep=keep, generator=generator, **common)
    elif lane == "disk_reload":
        publish = lanes.DiskReloadLane(policy, url, sync_dir, keep=keep, generator=generator, **common)
    else:
        raise ConfigError(f"sampler.lane={s.lane!r}: unknown lane")
    return generator, publish, [publish.close, *closers]


def rollout_engine(cfg: RunConfig, policy: Policy) -> tuple[InProcessEngine, InProcessLane]:
    """The in-process generator and how it gets new weights.

    On-policy (``max_head_offpolicy_versions = 0``) nothing samples during a train step, so the
    engine reads the live model and its lane only checks the version. Off-policy, sampling overlaps
    training, so the engine samples from its own replica, which receives the trainable weights
    after every step.
    """
    if cfg.loop.max_head_offpolicy_versions == 0:
        engine = InProcessEngine(policy.model, eos_ids=policy.eos_ids, pad_id=policy.tokenizer.pad_token_id,
                                 version=lambda: policy.version)
        return engine, InProcessLane(engine)
    engine = InProcessEngine.replica_of(policy)
    return engine, InProcessLane(engine, policy)


def _versions() -> dict[str, str]:
    return {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__,
            "python": platform.python_version()}


def make_loop(cfg: RunConfig, run_dir: Path, *, progress_cb: Callable[[Progress], None] | None = None,
              log: Callable[[str], None] = print) -> RLLoop:
    """Everything up to ``RLLoop.run``: config saved, base ready, seams built."""
    if cfg.model.threads:
        torch.set_num_threads(cfg.model.threads)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run_dir / CONFIG_FILE, cfg.model_dump(mode="json"))
    loss_config(cfg)  # fail on a bad [train] before spending the warm start
    rows, env = task_rows(cfg)
    base = prepare_base(cfg, run_dir, rows, env, log)
    seams = build_seams(cfg, base, env, run_dir)
    for close in seams["closers"]:
        atexit.register(close)  # engines, lanes, servers: stopped before the interpreter tears torch down
    info = {"versions": _versions(), "task": cfg.task.model_dump(mode="json"),
            "base_folder": BASE_DIR if base == run_dir / BASE_DIR else str(base),
            "run_config_sha256": cfg.digest()}
    dynamic_filter = None
    if cfg.task.dynamic_filter is not None:
        dynamic_filter = load_object(cfg.task.dynamic_filter)
        if not callable(dynamic_filter):
            raise ConfigError(f"task.dynamic_filter={cfg.task.dynamic_filter!r} is not a function of a group")
    return RLLoop(cfg.loop, env, rows, rollout_fn=seams["rollout_fn"], dynamic_filter=dynamic_filter, trainer=seams["trainer"],
                  heldout_eval=seams["heldout_eval"], weight_sync=seams["weight_sync"], out_dir=run_dir,
                  progress_cb=progress_cb, run_info=info)


def saved_config(run_dir: Path) -> RunConfig:
    path = run_dir / CONFIG_FILE
    if not path.exists():
        raise RLLoopError(f"{run_dir}: no {CONFIG_FILE}; is this an rlvr run folder?")
    return run_config_from_dict(json.loads(path.read_text()), str(path))


def export(run_dir: Path, out: Path, step: int | None = None) -> dict[str, str]:
    """Write checkpoint ``step`` (default: the selected one) as ``adapter/`` and ``merged/``."""
    cfg = saved_config(run_dir)
    record = read_record(run_dir)
    step = record.selected_step if step is None else step
    if step is None:
        raise RLLoopError(f"{run_dir}: no checkpoint was selected yet (no held-out evaluation recorded)")
    ckpt = run_dir / "checkpoints" / f"step_{step:06d}" / "trainer"
    if not ckpt.exists():
        raise RLLoopError(f"{run_dir}: checkpoint of step {step} is not on disk (pruned or never written)")
    base = run_dir / BASE_DIR if (run_dir / BASE_DIR).exists() else Path(str(cfg.loop.base))
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = load_tokenizer(str(base))
    written = {}
    if (ckpt / "adapter").exists():
        shutil.copytree(ckpt / "adapter", out / "adapter", dirs_exist_ok=True)
        written["adapter"] = str(out / "adapter")
        model = peft.PeftModel.from_pretrained(load_model(str(base), dtype=cfg.model.dtype), str(ckpt / "adapter"))
        model = model.merge_and_unload()
    else:
        from safetensors.torch import load_model as load_weights

        model = load_model(str(base), dtype=cfg.model.dtype)
        load_weights(model, str(ckpt / "weights.safetensors"))
    model.save_pretrained(out / "merged")
    tokenizer.save_pretrained(out / "merged")
    written["merged"] = str(out / "merged")
    (out / "export.json").write_text(json.dumps({"step": step, "run": str(run_dir), **written}, indent=2))
    return written
