"""The sections of an ``rlvr train`` file besides ``[loop]``, ``[train]`` and ``[critic]``: ``[model]``,
``[task]`` (and each ``[envs.NAME]``), ``[sft]``, ``[sampler]``, ``[algo]``, ``[watchdog]``, ``[log]`` and
``[cluster]``. Each is a strict pydantic model whose field descriptions are the configuration
reference; :class:`~rlvr.config.run.RunConfig` puts them together and checks what crosses sections.
Standard library + pydantic only.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from rlvr.config import StrictModel
from rlvr.config.algo_section import (
    AlgoSection,
)
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
                             "reverse_text, sorting, word_problems) when there is no data or environment rows")
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
    agent_concurrency: int | None = Field(
        None, ge=1,
        description="agent episodes running at once (task.agent or a hub environment's), in training and in "
        "held-out evaluation each; the others wait their turn, not counted against loop.rollout_timeout_s. For "
        "agents that start programs (a sandbox, a hub's harness); default: as many as are asked for")
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

    ``target`` names a field of each row's ``info`` to teach instead of the answer: a worked solution
    ending in the answer, where the rows carry one, so the base learns to work a problem, not to guess
    its result. Every training row must have it (a row without it fails, named).

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
    target: str | None = Field(None, min_length=1, description="the row's info field the warm start teaches (a "
                               "worked solution: word_problems' `solution`, GSM8K's `answer` column); unset: "
                               "the answer")


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
    restart. ``"sglang"`` samples from an SGLang server through its native ``/generate`` (token
    ids in, token ids and log-probs out): the one at ``url``, or one rlvr starts from
    ``sglang_python``; its lanes reload full weights with ``/update_weights_from_disk`` and
    hot-load adapters with ``/load_lora_adapter`` (see docs/inference.md). ``"vllm_colocate"``
    runs vLLM's engine inside the training process, on the trainer's
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
    backend: Literal["in_process", "http", "vllm", "sglang", "vllm_colocate"] = Field(
        "in_process", description="where rollouts and held-out are sampled: a thread of the training process, an "
        "OpenAI-compatible server (http), a vLLM server, an SGLang server (its native /generate), or vLLM's "
        "engine in the training process")
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
    sglang_python: str | None = Field(None, min_length=1, description="backend = 'sglang' without url: the "
                                      "interpreter of SGLang's environment; none: $RLVR_SGLANG_PYTHON, else this one "
                                      "if it has sglang")
    sglang_args: list[str] = Field(default_factory=list, description="extra flags for an SGLang server rlvr starts "
                                   "(e.g. '--mem-fraction-static', '0.5')")
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
            raise ValueError("sampler.replicas and a list of sampler.url need backend = 'http', 'vllm' or 'sglang'")
        if self.compile and self.backend != "in_process":
            raise ValueError(f"sampler.compile compiles the in-process engine's decoding; backend = "
                             f"{self.backend!r} samples with vLLM or a server (vLLM compiles its own)")
        if self.backend == "vllm_colocate":
            self._colocated()
        return self

    def _colocated(self) -> None:
        """What cannot apply to vLLM inside the training process: servers, and how they are reached."""
        server_keys = {"url": None, "replicas": 1, "lane": "auto", "serve_command": None, "stop_command": None,
                       "vllm_python": None, "sglang_python": None}
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
        return self.backend in ("http", "vllm", "sglang") and self.url is None


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


Sink = Literal["jsonl", "tensorboard", "mlflow", "wandb"]


class LogSection(StrictModel):
    """What a run reports beside its record: the metric sinks it mirrors to (``jsonl``, the record
    itself, is always written; ``tensorboard``, ``mlflow``, ``wandb`` each live in the run folder; W&B
    offline unless ``wandb_mode`` says otherwise), the sample completions it keeps, and the live
    progress display."""

    sinks: list[Sink] = Field(default_factory=lambda: list[Sink](["jsonl"]),
                              description="trackers to mirror metrics, config and samples to")
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
