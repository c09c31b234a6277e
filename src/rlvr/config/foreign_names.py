"""Other frameworks' names for rlvr's config keys, and the "did you mean" an unknown key gets.

Users arrive with TRL's ``GRPOConfig`` names (``learning_rate``, ``beta``, ``num_generations``...) and
verl's Hydra tree (``actor_rollout_ref.actor.optim.lr``...). A key rlvr does not know is refused, as
ever; :func:`suggest` says which rlvr key means the same thing (or why there is none), so the refusal
teaches the name instead of quoting a validator. The tables map a foreign name to ``(rlvr key,
note)``; the key is ``None`` where rlvr has no knob for it (the note says what rlvr does instead).
docs/coming_from_trl.md and docs/coming_from_verl.md print these tables; a test checks every rlvr
key named here exists.

Lookup order for an unknown ``section.key``: the same key in another section (``loop.max_new_tokens``
→ ``sampler.max_new_tokens``), the full dotted path in the verl table, the leaf in the TRL table, the
leaf in the verl table, then a close spelling among the section's keys, then a close spelling of a
foreign name (``lerning_rate`` is TRL's ``learning_rate``). Standard library only.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

__all__ = ["TRL_NAMES", "VERL_NAMES", "suggest"]

Entry = tuple[str | None, str]
FOREIGN_CUTOFF = 0.85  # how close a misspelt foreign name must be (difflib's ratio) to be read as one

TRL_NAMES: dict[str, Entry] = {
    "learning_rate": ("loop.lr", ""),
    "beta": ("loop.kl_coef", "the KL penalty's weight"),
    "num_generations": ("loop.group_k", "completions sampled per prompt"),
    "per_device_train_batch_size": ("train.micro_batch", "completions per forward-backward ('auto' sizes it to "
                                    "free memory); the step's batch is loop.tasks_per_step prompts x loop.group_k"),
    "gradient_accumulation_steps": ("train.micro_batch", "rlvr accumulates by itself: a step's whole batch "
                                    "(loop.tasks_per_step prompts x loop.group_k) is one optimizer step, run in "
                                    "micro_batch-row pieces"),
    "generation_batch_size": ("loop.tasks_per_step", "TRL counts completions, rlvr prompts: tasks_per_step = "
                              "generation_batch_size / num_generations"),
    "max_completion_length": ("sampler.max_new_tokens", ""),
    "max_prompt_length": (None, "rlvr never truncates a prompt: a row too long for the model's context is "
                          "refused at load, naming it"),
    "temperature": ("loop.temp", "training samples' temperature; held-out is greedy "
                    "(sampler.heldout_temperature)"),
    "top_p": ("sampler.top_p", ""),
    "num_train_epochs": ("loop.epochs", "the run stops after this many passes over the training split, or at "
                         "loop.max_steps, whichever comes first"),
    "top_k": ("sampler.top_k", ""),
    "min_p": ("sampler.min_p", ""),
    "repetition_penalty": ("sampler.repetition_penalty", ""),
    "lr_scheduler_type": ("train.lr_schedule", "constant, linear, cosine or wsd"),
    "warmup_ratio": ("train.warmup_ratio", ""),
    "warmup_steps": ("train.warmup_steps", ""),
    "gradient_checkpointing": ("train.gradient_checkpointing", ""),
    "mask_truncated_completions": ("train.mask_truncated_completions", ""),
    "reward_funcs": ("task.rewards", "in Python: rlvr.train(reward=[f, g]); a reward model id is 'rm:ID'"),
    "weight_decay": ("train.weight_decay", ""),
    "max_grad_norm": ("train.max_grad_norm", ""),
    "num_iterations": ("train.update_epochs", "passes over each sampled batch, against one old-policy snapshot"),
    "loss_type": ("train.aggregation", "TRL's 'grpo' is seq-mean-token-mean, 'bnpo' and 'dapo' token-mean, "
                  "'dr_grpo' constant (with loop.advantage = 'dr_grpo')"),
    "scale_rewards": ("loop.advantage", "scale_rewards = false is loop.advantage = 'dr_grpo'"),
    "epsilon": ("train.clip_eps_low", "with train.policy_loss = 'ppo', 'dapo' or 'gspo'"),
    "epsilon_high": ("train.clip_eps_high", "clip-higher, with train.policy_loss = 'ppo', 'dapo' or 'gspo'"),
    "importance_sampling_level": ("train.policy_loss", "sequence-level is train.policy_loss = 'gspo'"),
    "vllm_importance_sampling_cap": ("train.tis_cap", "TRL's older name of vllm_importance_sampling_clip_max"),
    "vllm_importance_sampling_clip_max": ("train.tis_cap", "modes *_truncate; *_mask is train.mis_high"),
    "vllm_importance_sampling_clip_min": ("train.mis_low", ""),
    "vllm_importance_sampling_mode": ("train.is_level", "token_* is 'token', sequence_* 'sequence_product'; "
                                      "*_truncate is train.tis_cap, *_mask train.mis_low / mis_high"),
    "steps_per_generation": ("train.ppo_n_minibatches", "optimizer steps taken from one sampled batch"),
    "eval_steps": ("loop.heldout_every", ""),
    "eval_strategy": ("loop.heldout_every", "held-out is always scored, at step 0 and every heldout_every steps"),
    "save_steps": ("loop.checkpoint_every", ""),
    "save_total_limit": ("loop.keep_last", "the selected checkpoint is always kept besides these"),
    "output_dir": (None, "the run folder is --out (rlvr.train(out=...))"),
    "push_to_hub": (None, "rlvr uploads nothing: `rlvr export RUN_DIR` writes the selected checkpoint as a PEFT "
                    "adapter, a merged model and a model card, ready for `hf upload`"),
    "hub_model_id": (None, "rlvr uploads nothing: `rlvr export RUN_DIR`, then `hf upload ID RUN_DIR/export/merged`"),
    "chat_template_kwargs": ("task.chat_template_kwargs", ""),
    "logging_steps": (None, "every step's metrics go to metrics.jsonl"),
    "report_to": ("log.sinks", ""),
    "run_name": ("log.run_name", ""),
    "log_completions": ("log.log_samples_every", "keep sample completions every N steps"),
    "num_completions_to_print": ("log.samples_per_step", ""),
    "use_vllm": ("sampler.backend", "sampler.backend = 'vllm'"),
    "vllm_mode": ("sampler.backend", "'colocate' is sampler.backend = 'vllm_colocate' (vLLM's engine in the "
                  "training process); 'server' is sampler.backend = 'vllm' (rlvr starts it, or sampler.url)"),
    "vllm_gpu_memory_utilization": ("sampler.vllm_kv_cache_gib", "rlvr sizes vLLM's KV cache in GiB, not as a "
                                    "share of the device"),
    "vllm_tensor_parallel_size": ("sampler.vllm_args", "vllm_args = ['--tensor-parallel-size', 'N']"),
    "vllm_server_base_url": ("sampler.url", ""),
    "vllm_server_host": ("sampler.url", "the whole URL, e.g. 'http://host:8000'"),
    "bf16": ("model.dtype", "model.dtype = 'bfloat16', or train.autocast = 'bfloat16' (float32 weights)"),
    "model_name_or_path": ("model.base", ""),
    "dataset_name": ("task.data", "a hub dataset is 'split@org/name'"),
    "dataset_train_split": ("task.data", "the split goes in the spec: 'train@org/name'"),
    "use_peft": ("loop.lora_rank", "LoRA is on by default (lora_rank = 16); 0 trains every weight"),
    "lora_r": ("loop.lora_rank", ""),
    "lora_alpha": ("train.lora_alpha", ""),
    "lora_target_modules": ("train.lora_targets", ""),
    "cliprange_value": ("critic.value_clip", "TRL's PPOTrainer"),
    "vf_coef": ("critic.vf_coef", "TRL's PPOTrainer"),
    "shuffle_dataset": (None, "training rows are drawn in a seeded shuffle per epoch (loop.seed)"),
}

VERL_NAMES: dict[str, Entry] = {
    "actor_rollout_ref.actor.optim.lr": ("loop.lr", ""),
    "actor_rollout_ref.actor.optim.weight_decay": ("train.weight_decay", ""),
    "actor_rollout_ref.actor.grad_clip": ("train.max_grad_norm", ""),
    "actor_rollout_ref.actor.use_kl_loss": ("loop.kl_coef", "the KL term is on when loop.kl_coef > 0"),
    "actor_rollout_ref.actor.kl_loss_coef": ("loop.kl_coef", ""),
    "actor_rollout_ref.actor.kl_loss_type": ("train.kl_estimator", "k1, k2 or k3 (verl's low_var_kl is k3)"),
    "actor_rollout_ref.actor.entropy_coeff": ("train.entropy_coef", ""),
    "actor_rollout_ref.actor.loss_agg_mode": ("train.aggregation", ""),
    "actor_rollout_ref.actor.policy_loss.loss_mode": ("train.policy_loss", ""),
    "actor_rollout_ref.actor.clip_ratio": ("train.clip_eps_low", "both sides, with train.policy_loss = 'ppo' "
                                           "(or 'dapo', 'gspo')"),
    "actor_rollout_ref.actor.clip_ratio_low": ("train.clip_eps_low", ""),
    "actor_rollout_ref.actor.clip_ratio_high": ("train.clip_eps_high", "clip-higher"),
    "actor_rollout_ref.actor.clip_ratio_c": ("train.dual_clip", ""),
    "actor_rollout_ref.actor.optim.lr_warmup_steps": ("train.warmup_steps", ""),
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": ("train.warmup_ratio", ""),
    "actor_rollout_ref.actor.optim.min_lr_ratio": ("train.min_lr_ratio", ""),
    "actor_rollout_ref.actor.optim.lr_scheduler_type": ("train.lr_schedule", "constant, linear, cosine or wsd"),
    "actor_rollout_ref.model.enable_gradient_checkpointing": ("train.gradient_checkpointing", ""),
    "actor_rollout_ref.rollout.top_k": ("sampler.top_k", ""),
    "actor_rollout_ref.actor.ppo_epochs": ("train.update_epochs", "passes over each batch"),
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": ("train.sequence_parallel", "Ulysses over that many "
                                                               "trainer ranks (--nproc)"),
    "actor_rollout_ref.actor.use_dynamic_bsz": ("train.micro_batch", "micro_batch = 'auto' sizes pieces to free "
                                                "memory"),
    "actor_rollout_ref.actor.fsdp_config.param_offload": ("train.offload", "offload = 'params' with "
                                                          "train.shard = 'fsdp': FSDP2's CPU offload"),
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": ("train.offload", "offload = 'optimizer': AdamW's "
                                                              "state on the CPU"),
    "actor_rollout_ref.ref.fsdp_config.param_offload": ("train.reference_on_cpu", "the KL reference on the CPU"),
    "critic.model.fsdp_config.param_offload": (None, "rlvr's critic is a value head on the policy's body"),
    "critic.model.fsdp_config.optimizer_offload": (None, "rlvr's critic is a value head on the policy's body"),
    "actor_rollout_ref.rollout.tensor_model_parallel_size": ("sampler.vllm_args",
                                                             "vllm_args = ['--tensor-parallel-size', 'N'] for the "
                                                             "vLLM rlvr runs; the trainer's own split is "
                                                             "train.tensor_parallel"),
    "actor_rollout_ref.rollout.gpu_memory_utilization": ("sampler.vllm_kv_cache_gib", "rlvr sizes vLLM's KV cache "
                                                         "in GiB, not as a share of the device"),
    "actor_rollout_ref.actor.ppo_mini_batch_size": ("train.ppo_n_minibatches",
                                                    "rlvr gives the count: tasks_per_step / ppo_mini_batch_size"),
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": ("train.micro_batch", "rows per forward-backward"),
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": ("train.micro_batch_tokens", "the most tokens one "
                                                          "micro-batch reads, besides train.micro_batch rows"),
    "actor_rollout_ref.actor.fsdp_config.fsdp_size": ("train.shard_size", "hybrid shard, with train.shard = 'fsdp'"),
    "actor_rollout_ref.model.path": ("model.base", ""),
    "actor_rollout_ref.model.lora_rank": ("loop.lora_rank", ""),
    "actor_rollout_ref.model.lora_alpha": ("train.lora_alpha", ""),
    "actor_rollout_ref.model.target_modules": ("train.lora_targets", ""),
    "actor_rollout_ref.rollout.n": ("loop.group_k", ""),
    "actor_rollout_ref.rollout.temperature": ("loop.temp", ""),
    "actor_rollout_ref.rollout.top_p": ("sampler.top_p", ""),
    "actor_rollout_ref.rollout.response_length": ("sampler.max_new_tokens", ""),
    "actor_rollout_ref.rollout.name": ("sampler.backend", "vLLM is sampler.backend = 'vllm', SGLang 'sglang'"),
    "actor_rollout_ref.rollout.val_kwargs.temperature": ("sampler.heldout_temperature", ""),
    "algorithm.adv_estimator": ("loop.advantage", "adv_estimator=gae is loop.advantage = 'gae' (a critic)"),
    "algorithm.norm_adv_by_std_in_grpo": ("loop.advantage", "false is loop.advantage = 'dr_grpo'"),
    "algorithm.rollout_is_threshold": ("train.tis_cap", "rollout_is_mode = 'truncate'; 'mask' is train.mis_high"),
    "algorithm.rollout_is_threshold_lower": ("train.mis_low", ""),
    "algorithm.rollout_is_level": ("train.is_level", "token, sequence (verl's geometric) or sequence_product "
                                   "(verl's sequence)"),
    "reward_model.overlong_buffer.len": ("train.overlong_buffer", ""),
    "reward_model.overlong_buffer.penalty_factor": ("train.overlong_penalty", ""),
    "algorithm.gamma": ("critic.gamma", ""),
    "algorithm.lam": ("critic.lam", ""),
    "critic.cliprange_value": ("critic.value_clip", ""),
    "critic.optim.lr": ("critic.lr", "the value head's learning rate"),
    "critic.grad_clip": ("train.max_grad_norm", "the value head is clipped on its own, at the same norm"),
    "critic.ppo_epochs": ("train.update_epochs", "the critic takes the policy's passes"),
    "critic.ppo_mini_batch_size": ("train.ppo_n_minibatches", "the critic steps with the policy's minibatches"),
    "critic.model.path": (None, "rlvr's critic is a value head on the policy's body, not a separate model"),
    "critic.loss_agg_mode": (None, "the value loss is a token-mean over the critic's tokens"),
    "trainer.critic_warmup": ("critic.warmup_steps", "the policy does not move while the critic warms up"),
    "algorithm.kl_ctrl.kl_coef": ("loop.kl_coef", "rlvr's KL is a loss term, never a reward penalty"),
    "algorithm.use_kl_in_reward": ("loop.kl_coef", "rlvr's KL is a loss term, never a reward penalty"),
    "algorithm.filter_groups.enable": ("loop.filter_zero_variance", ""),
    "algorithm.filter_groups.max_num_gen_batches": ("loop.max_oversample", "a bound on rows admitted per step"),
    "reward_model.enable": ("task.rewards", "a reward model is one of task.rewards: 'rm:PATH'"),
    "reward_model.model.path": ("task.rewards", "task.rewards = ['rm:PATH'] (a folder or a hub name)"),
    "reward_model.micro_batch_size_per_gpu": ("task.rewards", "'rm:PATH?batch_size=N'"),
    "data.train_files": ("task.data", "held-out rows are carved from it by content hash"),
    "data.val_files": ("task.eval_data", "external test sets; the held-out split is carved from task.data"),
    "data.train_batch_size": ("loop.tasks_per_step", ""),
    "data.max_response_length": ("sampler.max_new_tokens", ""),
    "data.max_prompt_length": (None, "rlvr never truncates a prompt: a row too long is refused at load"),
    "data.filter_overlong_prompts": (None, "rlvr never drops or truncates a row silently: a prompt too long for "
                                     "the model's context (with sampler.max_new_tokens) is refused at load, naming "
                                     "the row, so filter the data once yourself"),
    "data.truncation": (None, "rlvr never truncates: verl's truncation = 'error' is what it always does"),
    "data.apply_chat_template_kwargs": ("task.chat_template_kwargs", ""),
    "data.prompt_key": ("task.fields", "task.fields = {prompt = 'COLUMN'}"),
    "custom_reward_function.path": ("task.rewards", "task.rewards = ['file.py:fn']"),
    "custom_reward_function.name": ("task.rewards", "task.rewards = ['file.py:fn']"),
    "trainer.total_training_steps": ("loop.max_steps", ""),
    "trainer.total_epochs": ("loop.epochs", "or loop.max_steps, whichever comes first"),
    "trainer.test_freq": ("loop.heldout_every", ""),
    "trainer.save_freq": ("loop.checkpoint_every", ""),
    "trainer.max_actor_ckpt_to_keep": ("loop.keep_last", ""),
    "trainer.val_before_train": (None, "held-out is always scored at step 0"),
    "trainer.project_name": ("log.project", ""),
    "trainer.experiment_name": ("log.run_name", ""),
    "trainer.logger": ("log.sinks", ""),
    "trainer.default_local_dir": (None, "the run folder is --out"),
    "trainer.n_gpus_per_node": (None, "trainer ranks are `rlvr train --nproc N`"),
    "trainer.nnodes": (None, "several machines: see [cluster]"),
}

# A verl leaf that names one rlvr key wherever it is written (``--loop.kl_loss_coef``).
_VERL_LEAVES: dict[str, Entry] = {}
for _path, _entry in VERL_NAMES.items():
    _leaf = _path.rsplit(".", 1)[-1]
    if _leaf in _VERL_LEAVES and _VERL_LEAVES[_leaf][0] != _entry[0]:
        _VERL_LEAVES[_leaf] = (None, "")  # ambiguous across verl's tree: only its full path is matched
    else:
        _VERL_LEAVES.setdefault(_leaf, _entry)
_VERL_LEAVES = {k: v for k, v in _VERL_LEAVES.items() if v[0] is not None or v[1]}


def suggest(path: str, sections: Mapping[str, Iterable[str]]) -> str | None:
    """What to write instead of the unknown ``path`` (``"loop.learning_rate"``, ``"actor_rollout_ref.rollout.n"``,
    or a bare ``"learning_rate"``), given rlvr's ``sections`` (section → its keys); ``None`` when
    nothing comes close."""
    known = {name: set(keys) for name, keys in sections.items()}
    section, _, leaf = path.rpartition(".")
    if path in VERL_NAMES:
        return _named(VERL_NAMES, "verl's", path)
    elsewhere = sorted(f"{name}.{leaf}" for name, keys in known.items() if leaf in keys and name != section)
    if elsewhere:
        return f"did you mean {' or '.join(elsewhere)}?"
    for table, label in ((TRL_NAMES, "TRL's"), (_VERL_LEAVES, "verl's")):
        if leaf in table:
            return _named(table, label, leaf)
    pool = known.get(section) or {f"{name}.{k}" for name, keys in known.items() for k in keys}
    close = difflib.get_close_matches(leaf if section in known else path, sorted(pool), n=2, cutoff=0.75)
    if close:
        return f"did you mean {' or '.join((section + '.' + c) if section in known else c for c in close)}?"
    return _misspelt(path, leaf)


def _misspelt(path: str, leaf: str) -> str | None:
    """A close spelling of a verl path, a TRL name or a verl leaf (``lerning_rate``): the key it means."""
    for table, key, label in ((VERL_NAMES, path, "verl's"), (TRL_NAMES, leaf, "TRL's"), (_VERL_LEAVES, leaf, "verl's")):
        close = difflib.get_close_matches(key, sorted(table), n=1, cutoff=FOREIGN_CUTOFF)
        if close:
            target, note = table[close[0]]
            if target is None:
                return f"{key} looks like {label} {close[0]}, which has no rlvr key: {note}"
            return f"did you mean {target}? ({key} looks like {label} {close[0]}{'; ' + note if note else ''})"
    return None


def _named(table: Mapping[str, Entry], label: str, key: str) -> str:
    target, note = table[key]
    if target is None:
        return f"{label} {key} has no rlvr key: {note}"
    return f"did you mean {target}? ({label} {key}{'; ' + note if note else ''})"
