"""The legs of ``bench/gpu_compare.py``, each the body of a process of its own on the same device.

- ``build``: a random-weight Llama of a named shape with SmolLM2's real tokenizer, saved to a
  folder in the run's dtype (the weights are drawn on the device: seconds for 1.7 B on a GPU).
- ``rlvr``: ``rlvr train`` on the benchmark's config, called as ``python -m rlvr.cli train`` calls it,
  with every call of the in-process engine's ``sample_batch`` timed (wall-clock interval, rows,
  temperature: rollouts are sampled, held-out is greedy); per-step times come from the run record.
- ``trl``: TRL's ``GRPOTrainer`` on the same config (``bench/compare_trl.py``'s settings: same rows,
  prompts, reward, group shape, budget, LoRA, micro-batch), timed per optimizer step from its
  callbacks, its ``_generate`` timed inside each step.
- ``generate``: on the policy as rlvr builds it (LoRA unmerged), one step's batch sampled by plain
  ``model.generate(do_sample=True)`` (``bench/step_time.py``'s floor), by the same with the adapter
  disabled, and by rlvr's ``sample_batch`` alone, in interleaved rounds (``bench/real_model.py``);
  and the device's copy bandwidth, for the bandwidth floor.

Each leg returns a JSON-able dict with its peak memory: on CUDA ``torch.cuda.max_memory_allocated``,
on a CPU the process's peak RSS. Nothing here prints figures: the parent does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Nominal memory bandwidth (bytes/s) of devices the benchmark is run on, by a substring of their
# name; printed beside the measured copy bandwidth, which is the one the floor uses.
NOMINAL_BANDWIDTH = {"H200": 4.8e12, "H100 NVL": 3.9e12, "H100 PCIe": 2.0e12, "H100": 3.35e12}


def peak_memory(device: str) -> dict[str, Any]:
    import torch

    from rlvr.run.memory import peak_rss_mb

    if device.startswith("cuda"):
        return {"peak_mb": torch.cuda.max_memory_allocated() / 2**20, "peak_kind": "CUDA max_memory_allocated"}
    return {"peak_mb": peak_rss_mb(), "peak_kind": "peak RSS"}


def device_name(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.get_device_name()
    return f"CPU ({torch.get_num_threads()} torch threads)"


def llama_config(shape: dict[str, int], bos: int, eos: int, pad: int) -> Any:
    """SmolLM2's architecture (Llama, tied embeddings) at ``shape``'s sizes."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=shape["vocab"], hidden_size=shape["hidden"], intermediate_size=shape["intermediate"],
                       num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
                       num_key_value_heads=shape["kv_heads"], max_position_embeddings=8192, tie_word_embeddings=True,
                       bos_token_id=bos, eos_token_id=eos, pad_token_id=pad)


def build(shape: dict[str, int], tokenizer_dir: str, out: Path, device: str, dtype: str) -> dict[str, Any]:
    """A random-weight Llama of ``shape`` with the tokenizer of ``tokenizer_dir``, saved to ``out``."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    if len(tokenizer) > shape["vocab"]:
        raise SystemExit(f"the tokenizer at {tokenizer_dir} has {len(tokenizer)} tokens, the shape's vocabulary "
                         f"{shape['vocab']}: not SmolLM2's tokenizer")
    config = llama_config(shape, tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    model.to(getattr(torch, dtype))
    params = sum(p.numel() for p in model.parameters())  # tied embeddings counted once
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return {"base": str(out), "params": params, "weight_bytes": weight_bytes, "build_s": time.perf_counter() - start,
            "device_name": device_name(device)}


def time_sample_batch(engine_module: Any, calls: list[dict[str, Any]]) -> None:
    """Record every ``sample_batch`` call of the in-process engine: its wall-clock interval (the run
    record's clock), rows, temperature and thread."""
    inner = getattr(engine_module, "sample_batch", None)
    if not callable(inner):
        raise SystemExit("cannot time rlvr's sampling: rlvr.backends.sample.engine.sample_batch is not there any "
                         "more; update bench/gpu_legs.py to the engine's code")

    def timed(model: Any, prompts: Any, params: Any, **kwargs: Any) -> Any:
        start = time.time()
        try:
            return inner(model, prompts, params, **kwargs)
        finally:
            calls.append({"rows": len(prompts), "temperature": params.temperature, "start": start,
                          "end": time.time(), "thread": threading.current_thread().name})

    engine_module.sample_batch = timed


def run_rlvr(config: Path, work: Path, device: str) -> dict[str, Any]:
    """``rlvr train CONFIG --out WORK/rlvr_run`` in this process; its per-step figures and sampling calls."""
    from rlvr.backends.sample import engine as engine_module
    from rlvr.cli.commands import main
    from rlvr.record.run_record import EventKind, read_record

    calls: list[dict[str, Any]] = []
    time_sample_batch(engine_module, calls)
    run_dir = work / "rlvr_run"
    code = main(["train", str(config), "--out", str(run_dir)])
    if code != 0:
        raise SystemExit(f"rlvr train exited with status {code}; its output is above")
    record = read_record(run_dir)
    steps = [{"step": m["step"], "step_s": m["perf/step_time"], "wait_s": m["perf/sample_wait_time"],
              "train_s": m["perf/train_time"], "sync_s": m["perf/weight_sync_time"],
              "completion_len": m["rollout/completion_len"], "reward_std": m["rollout/reward_std"]}
             for m in record.metrics if "perf/step_time" in m]
    ends = {e.step: e.time for e in record.of_kind(EventKind.STEP)}
    return {"steps": steps, "step_ends": ends, "calls": calls, **peak_memory(device)}


def run_trl(config: Path, work: Path, device: str, precision: str) -> dict[str, Any]:
    """TRL's ``GRPOTrainer`` on the config; per optimizer step: wall time and time in ``_generate``."""
    import torch
    import trl
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOTrainer

    from compare_runs import load_setup
    from compare_trl import check_same_prompts, trl_args
    from phase_timing import PhaseClock
    from rlvr.backends.model.io import load_model, load_tokenizer
    from rlvr.wiring.base import reward_value

    cfg, env, split = load_setup(str(config), [])
    if cfg.model.threads:
        torch.set_num_threads(cfg.model.threads)
    model = load_model(cfg.model.base, dtype=cfg.model.dtype, device=device)
    tokenizer = load_tokenizer(cfg.model.base)
    check_same_prompts(tokenizer, split.train)
    by_id, reward = {t.id: t for t in split.train}, reward_value(env)
    lengths: list[int] = []

    def env_reward(prompts: list, completions: list, task_id: list, **kwargs: Any) -> list[float]:
        lengths.extend(len(ids) for ids in kwargs.get("completion_ids") or [])
        return [reward([*p, *c], by_id[i]) for p, c, i in zip(prompts, completions, task_id, strict=True)]

    peft_config = None
    if cfg.loop.lora_rank > 0:
        from peft import LoraConfig

        peft_config = LoraConfig(r=cfg.loop.lora_rank, lora_alpha=cfg.train.lora_alpha, lora_dropout=0.0,
                                 target_modules=list(cfg.train.lora_targets), bias="none", task_type="CAUSAL_LM")
    phases, steps, began = PhaseClock(), [], {}

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            began.update(t=time.perf_counter(), generate=phases.total("generate"))

        def on_step_end(self, args, state, control, **kwargs):
            steps.append({"step": state.global_step, "step_s": time.perf_counter() - began["t"],
                          "generate_s": phases.total("generate") - began["generate"]})

    args, settings = trl_args(cfg, work / "trl_out", precision, device)
    dataset = Dataset.from_list([{"prompt": [dict(m) for m in t.messages], "task_id": t.id} for t in split.train])
    trainer = GRPOTrainer(model=model, reward_funcs=env_reward, args=args, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[StepTimer()], peft_config=peft_config)
    trainer.remove_callback(PrinterCallback)
    phases.patch(trainer, "_generate", "generate")
    trainer.train()
    return {"steps": steps, "completion_len": sum(lengths) / len(lengths) if lengths else None,
            "settings": settings, "trl": trl.__version__, **peak_memory(device)}


def synced(device: str, fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` that returns once the device has finished its work (a timed call must not end early)."""
    import torch

    def run() -> object:
        out = fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return out
    return run


def copy_bandwidth(device: str, nbytes: int, repeats: int = 5) -> float:
    """Bytes per second a device-to-device copy moves (read + write), the best of ``repeats``."""
    import torch

    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        dst.copy_(src)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    return 2 * nbytes / min(seconds[1:])  # the first copy touches fresh pages: not counted


def run_generate(config: Path, device: str, repeats: int) -> dict[str, Any]:
    """One step's batch (``tasks_per_step x group_k`` rows, the config's budget and temperature)
    sampled three ways on the same LoRA policy, interleaved; and the device's copy bandwidth."""
    from compare_runs import load_setup
    from real_model import interleaved
    from rlvr.backends.model.io import render_prompt_ids
    from rlvr.backends.model.policy import LoraSpec, Policy
    from rlvr.backends.sample.batched import sample_batch
    from rlvr.seeding import derive_seed
    from rlvr.types import SamplingParams
    from step_time import floor_generate

    cfg, _, split = load_setup(str(config), [])
    lora = LoraSpec(rank=cfg.loop.lora_rank, alpha=cfg.train.lora_alpha, targets=tuple(cfg.train.lora_targets))
    policy = Policy(cfg.model.base, lora=lora if cfg.loop.lora_rank else None, dtype=cfg.model.dtype, device=device,
                    need_reference=False, seed=cfg.loop.seed)
    k = cfg.loop.group_k
    prompts = [render_prompt_ids(policy.tokenizer, t.messages) for t in split.train[:cfg.loop.tasks_per_step]
               for _ in range(k)]
    params = SamplingParams(max_tokens=cfg.sampler.max_new_tokens, temperature=cfg.loop.temp, top_p=cfg.sampler.top_p)
    seeds = [derive_seed(cfg.loop.seed, "gpu-bench", i) for i in range(len(prompts))]
    produced: list[float] = []

    def rlvr_sampling() -> None:
        outs = sample_batch(policy.model, prompts, params, seed=seeds, eos_ids=policy.eos_ids,
                            pad_id=policy.tokenizer.pad_token_id, share_prompts=cfg.sampler.share_prompts)
        produced.append(sum(len(o.ids) for o in outs) / len(outs))

    def without_adapter() -> None:
        with policy.model.disable_adapter():
            floor_generate(policy, prompts, cfg)

    variants = {"plain": synced(device, lambda: floor_generate(policy, prompts, cfg)),
                "rlvr": synced(device, rlvr_sampling)}
    if policy.is_lora:
        variants["plain_base"] = synced(device, without_adapter)
    times = interleaved(variants, repeats)
    bandwidth = copy_bandwidth(device, 2**31 if device.startswith("cuda") else 2**28)
    name = device_name(device)
    nominal = next((bw for key, bw in NOMINAL_BANDWIDTH.items() if key in name), None)
    return {"seconds": times, "rows": len(prompts), "prompt_tokens": [min(map(len, prompts)), max(map(len, prompts))],
            "rlvr_completion_len": produced[-1], "bandwidth": bandwidth,
            "nominal_bandwidth": nominal, "device_name": name, **peak_memory(device)}
