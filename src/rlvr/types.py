"""Data carriers: everything that crosses a seam.

Frozen, slotted dataclasses with no behaviour beyond small derived properties. Token-level fields
are tuples so a carrier can be shared between threads without copies going stale.
"version" always means policy version: the number of train steps applied to the policy (base = 0).
This module imports only the standard library.
"""

from __future__ import annotations

import copy
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from rlvr.errors import safe_repr

Message = dict[str, Any]  # {"role": "system"|"user"|"assistant"|"tool", "content": str, ...}


class StopReason(StrEnum):
    """Why a completion ended."""

    STOP = "stop"  # end-of-sequence token or a stop string
    LENGTH = "length"  # hit max_new_tokens
    ABORT = "abort"  # cancelled (server shutdown, run abort)


class Phase(StrEnum):
    """What the loop is doing; reported to progress hooks and the memory trace."""

    SETUP = "setup"
    SAMPLE = "sample"  # waiting for the rollout stream's next batch (sampled and scored)
    TRAIN = "train"
    HELDOUT = "heldout"
    CHECKPOINT = "checkpoint"
    DONE = "done"


class StopCause(StrEnum):
    """Why a run ended."""

    MAX_STEPS = "max_steps"
    EPOCHS = "epochs"  # the training split was seen loop.epochs times
    PATIENCE = "patience"
    ABORTED = "aborted"


@dataclass(frozen=True, slots=True)
class Task:
    """One corpus row, normalised. ``id`` is unique in the corpus; ``content_hash`` is not
    (identical rows share it; rows with the same normal form always land on the same side of the split)."""

    id: str  # unique in the corpus (duplicates get ~1, ~2...)
    messages: tuple[Message, ...]  # the prompt, OpenAI-style messages
    answer: Any  # what the reward compares against (any JSON value)
    content_hash: str  # of messages + answer as given (the split goes by their normal form: rlvr.data.normal)
    info: dict[str, Any] = field(default_factory=dict)  # the rest of the row (e.g. prompt_ids for token-in rows)
    env: str | None = None  # the environment it belongs to in a run of several; None with one
    conversational: bool = True  # False: the row gave a plain-text prompt (TRL's "standard" format)


@dataclass(frozen=True, slots=True)
class Split:
    """The corpus carved once, before step 0: the training tasks, the frozen held-out tasks, the
    rules that carved them, and the manifest (counts and content hashes) that pins them in run.json."""

    train: tuple[Task, ...]  # tasks the cursor draws from
    heldout: tuple[Task, ...]  # the frozen tasks only the evaluator sees
    heldout_frac: float  # the rules that carved it...
    salt: str  # ...(split_salt, never the run seed)...
    corpus_min: int  # ...and the corpus floor it passed
    manifest: dict[str, Any]  # counts and hashes, written to run.json


@dataclass(frozen=True, slots=True)
class Rollout:
    """One sampled trajectory for a task.

    ``completion_ids`` is everything after the prompt (for multi-turn, tool tokens included);
    ``logprobs`` and ``loss_mask`` align with it token by token. Logprobs are the behaviour
    policy's (the sampler's) and are 0 where the mask is 0. ``messages`` is the conversation
    including the generated turn(s), which is what the reward function scores.

    The credit streams, set by the run's algorithm (:mod:`rlvr.algos`) and aligned with
    ``completion_ids`` like the mask, tell the trainer what to learn from each token; it executes
    them without knowing the algorithm (the three components of
    :func:`rlvr.backends.train.losses.compute_loss`):

    - ``advantages``: the per-token advantage of the ``rl`` component; ``None`` = no rl credit
      (distillation), which is only legal when no token has an rl weight;
    - ``rl_weights``: ``None`` = the loss mask (every trainable token at weight 1);
    - ``ce_weights`` / ``ref_kl_weights``: ``None`` = that component is absent (nonzero = member,
      the value scales the token's loss);
    - ``ref_logprobs``: the reference's log-prob of each token (needed by ``ref_kl`` members);
    - ``token_rewards``: the reward of each token, for a trainer with a critic to turn into
      advantages by GAE (``loop.advantage = 'gae'``); ``advantages`` is then ``None`` and the trainer
      fills it. ``None`` = the rollout's credit is complete without a critic;
    - ``token_roles``: which message role wrote each token the environment added (``""`` for
      generated tokens); multi-turn episodes set it, ``echo`` reads it.
    """

    task_id: str  # the row it samples
    prompt_ids: tuple[int, ...]  # exactly what the generator was given
    completion_ids: tuple[int, ...]  # everything after the prompt, tool tokens included
    logprobs: tuple[float, ...]  # the behaviour policy's, per completion token (0 where masked)
    text: str  # the completion decoded
    messages: tuple[Message, ...]  # the conversation the reward scores, generated turns included
    version: int | None = None  # policy version that sampled it (the stream stamps it if None)
    stop_reason: StopReason = StopReason.STOP  # why generation ended
    loss_mask: tuple[int, ...] | None = None  # None: every completion token is trainable
    reward: float | None = None  # set by scoring; None until scored
    metrics: dict[str, float] = field(default_factory=dict)  # what the environment reported beside the reward
    advantages: tuple[float, ...] | None = None  # per token; None: no rl credit
    rl_weights: tuple[float, ...] | None = None  # None: the loss mask
    ce_weights: tuple[float, ...] | None = None  # None: no ce component
    ref_kl_weights: tuple[float, ...] | None = None  # None: no ref_kl component
    ref_logprobs: tuple[float, ...] | None = None  # the reference's, per token
    token_rewards: tuple[float, ...] | None = None  # per token, for the critic's GAE; None: no critic credit
    token_roles: tuple[str, ...] | None = None  # role that wrote each environment token ("" if generated)

    @property
    def mask(self) -> tuple[int, ...]:
        return self.loss_mask if self.loss_mask is not None else (1,) * len(self.completion_ids)

    @property
    def rl_mask(self) -> tuple[float, ...]:
        """The rl component's per-token weights (the loss mask unless the algorithm set them)."""
        return self.rl_weights if self.rl_weights is not None else tuple(float(m) for m in self.mask)

    @property
    def advantage(self) -> float:
        """One number for logs and filters: the mean advantage over rl tokens (0 without any)."""
        if self.advantages is None:
            return 0.0
        picked = [a for a, w in zip(self.advantages, self.rl_mask, strict=False) if w]
        return sum(picked) / len(picked) if picked else 0.0


@dataclass(frozen=True, slots=True)
class Group:
    """The ``group_k`` rollouts of one task, scored; once credited, each carries its streams."""

    task: Task  # the row
    rollouts: tuple[Rollout, ...]  # its samples (an episode's segments are consecutive)

    @property
    def rewards(self) -> tuple[float, ...]:
        return tuple(r.reward if r.reward is not None else 0.0 for r in self.rollouts)

    @property
    def advantages(self) -> tuple[float, ...]:
        """One number per rollout (its mean advantage over rl tokens), for logs and filters."""
        return tuple(r.advantage for r in self.rollouts)


@dataclass(frozen=True, slots=True)
class Batch:
    """What one train step consumes."""

    step: int  # the optimizer step it is for (= trained version + 1)
    groups: tuple[Group, ...]  # one per row

    @property
    def rollouts(self) -> list[Rollout]:
        return [r for g in self.groups for r in g.rollouts]

    @property
    def advantages(self) -> list[float]:
        """Each rollout's mean advantage (see :attr:`Rollout.advantage`); the streams are on the rollouts."""
        return [a for g in self.groups for a in g.advantages]


@dataclass(frozen=True, slots=True)
class CheckpointRef:
    """A saved checkpoint. ``parent`` is the step of the checkpoint it was trained from."""

    step: int  # the step it was taken after
    path: str | None  # relative to the run folder; None without one
    parent: int | None  # step of the previous checkpoint


@dataclass(frozen=True, slots=True)
class EvalReport:
    """A held-out evaluation: the mean score over ``n`` tasks."""

    step: int  # the step it scores
    score: float  # mean over the held-out tasks
    n: int | None = None  # how many tasks were scored
    per_task: dict[str, float] | None = None  # score by task id, when the evaluator gives it


@dataclass(frozen=True, slots=True)
class GateDecision:
    """The held-out gate's reading after an evaluation."""

    step: int  # the evaluation just observed
    score: float  # its held-out score
    best_step: int  # the checkpoint published so far
    best_score: float  # its held-out score
    improved: bool  # strictly better than every earlier evaluation
    evals_since_best: int  # evaluations without improvement
    stop: bool  # patience ran out


@dataclass(frozen=True, slots=True)
class Progress:
    """What a ``progress_cb`` receives."""

    step: int  # the step in progress
    max_steps: int  # the run's budget
    phase: Phase  # what the loop is doing
    pool_score: float | None  # mean training reward of the last step
    last_heldout: float | None  # latest held-out score
    eta_s: float | None  # seconds to max_steps at the pace so far
    rss_mb: float | None  # resident memory now
    rows_done: int | None = None  # during an evaluation (phase heldout): rows scored so far
    rows_total: int | None = None  # ... of this many


# ---- sampling: what a generator is asked and what it answers ----------------------------------
@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to sample one completion (vLLM's names and semantics). The log-probs a generator records
    are those of the distribution it actually sampled from: after the penalty, temperature and the
    ``min_p`` / ``top_k`` / ``top_p`` truncations, renormalised (vLLM's ``processed_logprobs``)."""

    max_tokens: int = 16  # completion budget per generate call
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # nucleus mass (1 = off)
    top_k: int = 0  # keep the k most likely tokens (0 or -1 = off)
    min_p: float = 0.0  # drop tokens less likely than min_p times the most likely one (0 = off)
    repetition_penalty: float = 1.0  # on tokens of the prompt and completion so far (1 = off)
    stop: tuple[str, ...] = ()  # strings that end a completion
    stop_token_ids: tuple[int, ...] = ()  # tokens that end a completion as eos does (kept in it)
    allowed_token_ids: tuple[int, ...] | None = None  # when set, the only tokens that may be sampled
    bad_words_ids: tuple[tuple[int, ...], ...] = ()  # token sequences never completed


@dataclass(frozen=True, slots=True)
class Completion:
    """What a generator returns: the sampled ids, their log-probs, why it stopped, and the policy
    version that produced them (``None`` when the generator cannot tell)."""

    ids: tuple[int, ...]  # the sampled token ids
    logprobs: tuple[float, ...]  # of each sampled token under the sampling distribution
    stop_reason: StopReason  # EOS/stop string, length, or abort
    version: int | None = None  # the policy version that produced it, None if unknown


@dataclass(frozen=True, slots=True)
class RolloutRequest:
    """One sample of one row: the row, which of its ``group_k`` samples this is, the policy version
    it was admitted under, and the seed its draw must use (derived from the run seed and these)."""

    task: Task  # the row
    index: int  # which of its group_k samples
    version: int  # policy version it was admitted under
    seed: int  # derived from (run seed, row, index, version)

    @property
    def id(self) -> str:
        return self.task.id

    # Fresh copies on every access: an environment that edits what it is given (a turn counter in
    # info, a rewritten message) must not change the row for the next sample or the next epoch.
    @property
    def messages(self) -> tuple[Message, ...]:
        return copy.deepcopy(self.task.messages)

    @property
    def answer(self) -> Any:
        return copy.deepcopy(self.task.answer)

    @property
    def info(self) -> dict[str, Any]:
        return copy.deepcopy(self.task.info)


# ---- environments and the stream ------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Drop:
    """A row filtered or a sample dropped, and why."""

    task_id: str  # the row
    reason: str  # why, in words
    sample: int | None = None  # the sample index for a dropped sample; None for a whole row

    def as_dict(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "reason": self.reason,
                **({} if self.sample is None else {"sample": self.sample})}


@dataclass(frozen=True, slots=True)
class StreamBatch(Batch):
    """One train batch (``step`` = the version it trains + 1) and what happened to the rows
    admitted for it."""

    admitted: int  # rows admitted for this batch, kept or filtered
    filtered: tuple[Drop, ...]  # rows filtered since the previous batch
    sample_drops: tuple[Drop, ...]  # samples dropped since the previous batch
    finished: int  # rows that finished sampling since the previous batch, kept or filtered
    trajectories: tuple[Trajectory, ...] = ()  # the shape of each sample the batch's groups hold
    scoring_s: float = 0.0  # wall time rows were being scored since the previous batch (timing, not content)

    @property
    def filter_drop_ratio(self) -> float:
        return len(self.filtered) / self.finished if self.finished else 0.0


@dataclass(frozen=True, slots=True)
class Trajectory:
    """The shape of one sample: ``turns`` = model turns (runs of generated, loss-mask tokens over
    its segments, one per generation call) and ``tokens`` = the length of its final context (the
    last segment's prompt plus completion: the whole conversation as the model last saw it)."""

    turns: int
    tokens: int

    @classmethod
    def of(cls, segments: Sequence[Rollout]) -> Trajectory:
        turns = 0
        for r in segments:
            previous = 0
            for m in r.mask:
                if m and not previous:
                    turns += 1
                previous = m
        last = segments[-1]
        return cls(turns, len(last.prompt_ids) + len(last.completion_ids))


# ---- rewards ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Score:
    """A reward made of named components.

    ``value = sum(weights[k] * components[k])`` over the weighted components. A component without
    a weight has weight 0: it is a **metric only**, recorded but never paid. We chose 0 over 1 so
    that adding a diagnostic (a length, a ``parsed`` flag) can never silently change the reward;
    the opposite mistake (forgetting every weight) is caught instead: a Score needs at least one
    weight, and every weight must name a component, so a typo fails at construction.
    Components and weights are finite real numbers (``bool`` is refused: write 1.0/0.0).

    ``Score.of(1.0, parsed=1.0)`` is the common case: one paid ``reward`` component plus metrics.
    """

    components: dict[str, float]
    weights: dict[str, float]

    def __post_init__(self) -> None:
        components = _float_dict("components", self.components)
        weights = _float_dict("weights", self.weights)
        if not components:
            raise ValueError("Score needs at least one component")
        unknown = sorted(set(weights) - set(components))
        if unknown:
            raise ValueError(f"Score weights name no component: {unknown}; components are {sorted(components)}")
        if not weights:
            raise ValueError(
                f"Score has no weights, so its value would always be 0; give weights for the paid "
                f"components, e.g. weights={{{next(iter(components))!r}: 1.0}} (unweighted ones are metrics)"
            )
        object.__setattr__(self, "components", components)
        object.__setattr__(self, "weights", weights)

    @classmethod
    def of(cls, reward: float, /, **metrics: float) -> Score:
        """A Score paying ``reward`` (component ``"reward"``, weight 1) with metrics beside it."""
        if "reward" in metrics:
            raise ValueError("Score.of: 'reward' is the paid component; name the metric differently")
        return cls({"reward": reward, **metrics}, {"reward": 1.0})

    @property
    def value(self) -> float:
        """The paid reward: the weighted sum of the weighted components."""
        return math.fsum(w * self.components[k] for k, w in self.weights.items())

    @property
    def metrics(self) -> dict[str, float]:
        """Every component (paid or not), as recorded beside the reward."""
        return dict(self.components)


def _float_dict(what: str, values: Any) -> dict[str, float]:
    if not isinstance(values, Mapping):
        raise TypeError(f"Score {what} must be a dict of name -> float, got {type(values).__name__}")
    out: dict[str, float] = {}
    for key, value in values.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"Score {what} keys must be non-empty strings, got {safe_repr(key)}")
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"Score {what}[{key!r}] must be a real number (not bool), got {safe_repr(value)}")
        number = float(value)
        if not math.isfinite(number):
            raise ValueError(f"Score {what}[{key!r}] must be finite, got {number}")
        out[key] = number
    return out
