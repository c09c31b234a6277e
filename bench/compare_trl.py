"""TRL's side of ``bench/trl_compare.py``: ``GRPOTrainer`` on the same base, rows, prompts, reward,
group shape and hyper-parameters as rlvr's run of the config, in a process of its own.

Matched to the config: lr (constant, no warmup, AdamW, weight decay and grad-norm clip from
``[train]``), temperature and top-p (top-k off), ``num_generations = group_k``, ``tasks_per_step``
prompts per optimizer step, one generation per optimizer step (on-policy: TRL then computes no old
log-probs), completion budget and stop tokens, KL weight (``beta = loop.kl_coef``), group advantages
scaled by the group std (``scale_rewards="group"``) and the token mean over the whole batch
(``loss_type="dapo"``, rlvr's ``token-mean``); LoRA through ``peft_config`` with rlvr's rank, alpha,
targets and no dropout (``lora_rank = 0``: full fine-tune, as rlvr then does).

At TRL's documented settings for a CPU: ``use_cpu``, no vLLM (it needs its own device here),
transformers' ``generate`` with its default dynamic KV cache, gradient checkpointing off, the
same torch threads as rlvr, micro-batches of ``train.micro_batch`` sequences
(``per_device_train_batch_size``) accumulated over the step, and fp32 or bf16 autocast (transformers'
CPU recipe, ``bf16=True``) as ``--trl-precision`` says; no logging, no saving.

TRL's generation is checked, not assumed, to be a plain ``generate`` on this CPU, so nothing in it
is changed from TRL's defaults: ``_generate`` wraps ``generate`` in ``torch.no_grad``; it runs in
train mode, but no dropout is in effect (the model's attention dropout is 0, the adapter's
``lora_dropout`` 0); it stops at ``<|im_end|>``, the tokenizer's eos and the model's generation
config's (id 2), with no ``min_new_tokens``, the dynamic cache and compile disabled by TRL; prompts
are left-padded; the LoRA adapter stays unmerged on every forward, as it does in rlvr and as TRL
does for transformers generation (it merges only to hand weights to vLLM); weights are fp32; the
process keeps the config's torch threads through ``GRPOTrainer``'s setup (accelerate resets threads
only for multi-process CPU runs); the whole generation batch (``tasks_per_step * group_k``) goes to
one ``generate`` call, as a plain ``generate`` of the step's prompts does. Measured in one process on
the real model (SmolLM2-135M, LoRA r16, 2 threads on 2 cores): 64 prompts x 16 new tokens, TRL's
``_generate`` 12.2 s and 13.4 s against 14.3 s and 11.5 s for ``generate`` with TRL's generation
config on the same adapter-wrapped model. What makes it look slow is a busy machine: with other
processes on the 2 cores, the same 8 x 8 ``generate`` takes 10 to 95 s instead of 3 s, for TRL and
the plain call alike, its two threads queued for a core, between them, about as long as the call
took (decoding is hundreds of tiny multi-threaded kernels per token, each waiting for the thread the
scheduler parked). The report therefore gives each process's queued share (``bench/cpu_share.py``)
and flags a run measured on a busy machine.

Phases, timed from outside TRL: generate = ``GRPOTrainer._generate`` (prompt tokenization, generate,
decode), score = ``_calculate_rewards``, forward-backward = ``training_step`` less ``_prepare_inputs``
(the loss and backward of every micro-batch), optimizer = between the ``on_pre_optimizer_step`` and
``on_optimizer_step`` callbacks (``optimizer.step()`` alone; clipping counts as forward-backward, as
for rlvr), sync = 0 (TRL generates with the model it trains).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from compare_runs import EvalClock, heldout_scorer, load_setup
from phase_timing import PhaseClock


def check_same_prompts(tokenizer: Any, tasks: list[Any]) -> None:
    """Refuse to compare if TRL would feed the model other token ids than rlvr for any prompt."""
    from rlvr.backends.model.io import render_prompt_ids

    for task in tasks:
        messages = [dict(m) for m in task.messages]
        ours = render_prompt_ids(tokenizer, messages)
        theirs = tokenizer.apply_chat_template(conversation=[messages], add_generation_prompt=True, tokenize=True,
                                               return_dict=True)["input_ids"][0]
        if list(theirs) != list(ours):
            raise SystemExit(f"row {task.id!r}: TRL tokenizes the prompt as {list(theirs)[:40]}..., rlvr as "
                             f"{ours[:40]}...; the libraries would not see the same prompts")


def trl_args(cfg: Any, out_dir: Path, precision: str, device: str = "cpu") -> tuple[Any, dict[str, Any]]:
    """TRL's settings matched to the config; ``device`` other than "cpu": accelerate's own device
    (the GPU), as TRL runs there by default."""
    from trl import GRPOConfig

    loop, train = cfg.loop, cfg.train
    batch = loop.tasks_per_step * loop.group_k
    micro = batch if train.micro_batch == "auto" else min(train.micro_batch, batch)  # TRL has no auto sizing
    if batch % micro:
        micro = batch  # TRL splits a generation batch into equal micro-batches only
    settings = {
        "precision": "bf16 autocast" if precision == "bf16-amp" else "fp32", "device": device,
        "threads": cfg.model.threads,
        "per_device_train_batch_size": micro, "gradient_accumulation_steps": batch // micro,
        "generation_batch_size": batch, "use_vllm": False, "gradient_checkpointing": False,
        "loss_type": "dapo", "scale_rewards": "group", "beta": loop.kl_coef, "lora_rank": loop.lora_rank,
    }
    args = GRPOConfig(
        output_dir=str(out_dir), max_steps=loop.max_steps, learning_rate=loop.lr,
        lr_scheduler_type="constant", warmup_steps=0, weight_decay=train.weight_decay,
        max_grad_norm=train.max_grad_norm, optim="adamw_torch",
        per_device_train_batch_size=micro, gradient_accumulation_steps=batch // micro,
        generation_batch_size=batch,  # one generation per optimizer step: on-policy, as rlvr at O = 0
        num_iterations=1, num_generations=loop.group_k, max_completion_length=cfg.sampler.max_new_tokens,
        temperature=loop.temp, top_p=cfg.sampler.top_p, top_k=0, beta=loop.kl_coef,
        loss_type="dapo", scale_rewards="group", use_vllm=False, use_cpu=device == "cpu",
        bf16=precision == "bf16-amp", fp16=False, gradient_checkpointing=False,
        seed=loop.seed, data_seed=loop.seed, save_strategy="no", logging_strategy="no", report_to="none",
        disable_tqdm=True, log_completions=False, dataloader_num_workers=0,
    )
    return args, settings


def run_trl(config: str, overrides: list[str], work: Path, base: str, precision: str) -> dict[str, Any]:
    import torch
    import trl
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOTrainer

    from rlvr.backends.model.io import load_model, load_tokenizer
    from rlvr.run.memory import peak_rss_mb
    from rlvr.wiring.base import reward_value

    cfg, env, split = load_setup(config, overrides)
    if cfg.model.threads:
        torch.set_num_threads(cfg.model.threads)
    model = load_model(base, dtype="float32")
    tokenizer = load_tokenizer(base)
    check_same_prompts(tokenizer, [*split.train, *split.heldout])
    by_id = {t.id: t for t in split.train}
    reward = reward_value(env)

    def env_reward(prompts: list, completions: list, task_id: list, **_: Any) -> list[float]:
        # Conversational rows: prompts and completions are message lists, as the environment scores them.
        return [reward([*p, *c], by_id[i]) for p, c, i in zip(prompts, completions, task_id, strict=True)]

    peft_config = None
    if cfg.loop.lora_rank > 0:
        from peft import LoraConfig

        peft_config = LoraConfig(r=cfg.loop.lora_rank, lora_alpha=cfg.train.lora_alpha, lora_dropout=0.0,
                                 target_modules=list(cfg.train.lora_targets), bias="none", task_type="CAUSAL_LM")
    phases, clock, every = PhaseClock(), None, cfg.loop.heldout_every

    class Probe(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            nonlocal clock
            clock = EvalClock("trl ", heldout_scorer(model, tokenizer, split, env, cfg.sampler.max_new_tokens))
            clock.evaluate(0)

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            phases.start("optimizer")

        def on_optimizer_step(self, args, state, control, **kwargs):
            phases.stop("optimizer")

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % every == 0 or state.global_step == state.max_steps:
                clock.evaluate(state.global_step)

    args, settings = trl_args(cfg, work / "trl_out", precision)
    dataset = Dataset.from_list([{"prompt": [dict(m) for m in t.messages], "task_id": t.id} for t in split.train])
    trainer = GRPOTrainer(model=model, reward_funcs=env_reward, args=args, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[Probe()], peft_config=peft_config)
    trainer.remove_callback(PrinterCallback)  # no end-of-training metrics dump
    phases.patch(trainer, "_generate", "generate")
    phases.patch(trainer, "_calculate_rewards", "score")
    phases.patch(trainer, "training_step", "training_step")
    phases.patch(trainer, "_prepare_inputs", "prepare_inputs")
    trainer.train()
    totals = phases.totals()
    totals["forward-backward"] = totals.get("training_step", 0.0) - totals.get("prepare_inputs", 0.0)
    totals["sync"] = 0.0
    return {"curve": clock.curve, "eval_s": clock.eval_s, "phases": totals, "peak_rss_mb": peak_rss_mb(),
            "heldout_hash": split.manifest["heldout_hash"], "settings": settings, "trl": trl.__version__}
