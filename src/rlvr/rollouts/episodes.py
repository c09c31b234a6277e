"""Per-sample rollouts: the contract between the loop and whatever produces trajectories.

A rollout function is ``async def rollout_fn(row: RolloutRequest) -> Rollout | None``. It is built
once per run by a user factory ``make_rollout_fn(setup: RolloutSetup)``, which receives the
generator (any sampler: in-process engine, OpenAI-compatible HTTP server, fake), the tokenizer,
the sampling parameters and the environment. The loop fans each admitted row out to ``group_k``
calls and joins the samples by row. ``None`` drops the sample (its group shrinks); a sample
returned with ``reward=None`` is scored by the loop with the environment's reward function.

Users who only write a reward never see this layer: :func:`single_turn` is the default,
built from the environment and the generator.

The generator speaks tokens: ``generate(prompt_ids, params, seed=...)`` returns the exact sampled
ids and their behaviour log-probs, so the trainer scores exactly what was sampled.
Standard library only.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlvr.errors import RLLoopError
from rlvr.protocols import ChatTokenizer, GroupFn, RolloutFn, RolloutSetup, SampleOutcome
from rlvr.rollouts.clock import bounded, clocked
from rlvr.types import Message, Rollout, RolloutRequest, StopReason, Task


def new_state(answer: Any, info: Mapping[str, Any] | None = None, *, turn: int = 0) -> dict[str, Any]:
    """The per-rollout state dict the loop creates before the first model turn."""
    return {"answer": answer, "info": dict(info or {}), "turn": turn}


def prompt_ids_of(task: Task, tokenizer: ChatTokenizer) -> list[int]:
    """A token-in row (``info["prompt_ids"]``) as given; otherwise the rendered messages."""
    given = task.info.get("prompt_ids")
    if given is not None:
        if not isinstance(given, (list, tuple)) or not given or not all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in given):
            raise ValueError(f"row {task.id!r}: info.prompt_ids must be a non-empty list of token ids")
        return list(given)
    return tokenizer.render(task.messages)


def single_turn(setup: RolloutSetup) -> RolloutFn:
    """The default rollout: render the row, generate once, return the unscored sample."""
    cache: dict[str, tuple[int, ...]] = {}
    generator = clocked(setup.generator)  # its waits are not the rollout's own time (rlvr.rollouts.clock)

    async def rollout(row: RolloutRequest) -> Rollout:
        prompt = cache.get(row.id)
        if prompt is None:
            prompt = cache[row.id] = tuple(prompt_ids_of(row.task, setup.tokenizer))
        out = await generator.generate(prompt, setup.params, seed=row.seed)
        text = setup.tokenizer.decode(out.ids)
        return Rollout(task_id=row.id, prompt_ids=prompt, completion_ids=tuple(out.ids),
                       logprobs=tuple(out.logprobs), text=text,
                       messages=(*row.messages, {"role": "assistant", "content": text}),
                       version=out.version, stop_reason=out.stop_reason)

    return rollout


def multi_turn(setup: RolloutSetup, *, max_turns: int) -> RolloutFn:
    """Message-in rollouts over ``setup.env``'s ``interact``, up to ``max_turns`` model turns.

    Each turn generates from the whole conversation so far; ``interact(messages, state)`` answers
    (tool results, a retry prompt) or ends the episode with ``[]``. Token ids only ever extend:
    the next prompt is the conversation re-rendered with the chat template, and it must start with
    exactly the ids already sampled (the prefix property). Generated tokens get loss mask 1 and
    their behaviour log-probs; tokens the environment added get mask 0 and log-prob 0. Where a
    template breaks the prefix property (it re-tokenizes or rewrites earlier turns), the episode
    is split into training segments, one per break, each with its own prompt; the segments share
    the episode's reward and advantage. Masks are never shifted to paper over a mismatch.
    """
    if max_turns < 1:
        raise ValueError(f"max_turns must be >= 1, got {max_turns}")
    env, tok, gen = setup.env, setup.tokenizer, clocked(setup.generator)
    interact = getattr(env, "interact", None)
    if interact is None:
        raise ValueError("multi-turn rollouts need an environment with interact(messages, state)")

    async def rollout(row: RolloutRequest) -> Rollout | list[Rollout]:
        from rlvr.seeding import derive_seed

        state = new_state(row.answer, row.info)
        messages = list(row.messages)
        prompt = tuple(prompt_ids_of(row.task, tok))
        ids = list(prompt)
        segments: list[Rollout] = []
        completion: list[int] = []
        logprobs: list[float] = []
        mask: list[int] = []
        roles: list[str] = []  # who wrote each token: "" generated, else the message role that added it
        versions: list[int] = []
        stop, text = StopReason.STOP, ""
        for turn in range(1, max_turns + 1):
            out = await gen.generate(ids, setup.params, seed=derive_seed(row.seed, "turn", turn))
            text = tok.decode(out.ids)
            completion += out.ids
            logprobs += out.logprobs
            mask += [1] * len(out.ids)
            roles += [""] * len(out.ids)
            ids += out.ids
            if out.version is not None:
                versions.append(out.version)
            messages.append({"role": "assistant", "content": text})
            stop = out.stop_reason
            if stop != StopReason.STOP or turn == max_turns:
                break
            state["turn"] = turn
            reply = await asyncio.to_thread(interact, list(messages), state)
            if not reply:
                break
            messages.extend(reply)
            rendered = tok.render(messages)
            if rendered[: len(ids)] == ids:
                added = rendered[len(ids):]
                completion += added
                logprobs += [0.0] * len(added)
                mask += [0] * len(added)
                roles += _roles_of(tok, messages, len(reply), len(ids), len(rendered))
            else:  # the template rewrote the past: close this segment, start the next from here
                segments.append(_segment(row, prompt, completion, logprobs, mask, text, messages, versions, stop,
                                         roles))
                prompt, completion, logprobs, mask, roles = tuple(rendered), [], [], [], []
            ids = list(rendered)
        last = _segment(row, prompt, completion, logprobs, mask, text, messages, versions, stop, roles)
        return [*segments, last] if segments else last

    return rollout


def _segment(row: RolloutRequest, prompt: tuple[int, ...], completion: list[int], logprobs: list[float],
             mask: list[int], text: str, messages: list[Message], versions: list[int], stop: StopReason,
             roles: list[str]) -> Rollout:
    # The oldest policy that wrote any of it: staleness is judged by the worst token.
    return Rollout(task_id=row.id, prompt_ids=prompt, completion_ids=tuple(completion), logprobs=tuple(logprobs),
                   text=text, messages=tuple(messages), version=min(versions) if versions else None,
                   stop_reason=stop, loss_mask=tuple(mask), token_roles=tuple(roles))


def _roles_of(tok: Any, messages: list[Message], n_reply: int, start: int, end: int) -> list[str]:
    """The role of each token the environment added (positions ``start:end`` of the rendering): each
    reply message owns the tokens its rendering adds (its framing included); the generation prompt
    that closes the rendering belongs to the last one."""
    if n_reply == 1:
        return [str(messages[-1].get("role", ""))] * (end - start)
    roles: list[str] = []
    before = len(messages) - n_reply
    for j in range(1, n_reply):
        upto = len(tok.render(messages[: before + j]))  # ends with a generation prompt the next message replaces
        upto = max(start + len(roles), min(upto, end))
        roles += [str(messages[before + j - 1].get("role", ""))] * (upto - start - len(roles))
    return roles + [str(messages[-1].get("role", ""))] * (end - start - len(roles))


# ---- what the loop runs per row -------------------------------------------------------------
def group_from_rollout_fn(rollout_fn: RolloutFn, timeout_s: float | None = None) -> GroupFn:
    """Fan a row out to ``k`` concurrent rollout-function calls, each bounded by ``timeout_s`` of its own
    time (:func:`~rlvr.rollouts.clock.bounded`: waits for generation not counted). A rollout
    function that runs whole rows elsewhere (it offers ``group_fn(timeout_s)``, as the remote workers'
    :class:`~rlvr.rollouts.remote.RemoteRollouts` does) is handed whole rows, each sample bounded there."""
    whole_rows = getattr(rollout_fn, "group_fn", None)
    if callable(whole_rows):
        return whole_rows(timeout_s)
    one = bounded(rollout_fn, timeout_s)

    async def group(task: Task, k: int, version: int, seed_of: Callable[[int], int]) -> list[SampleOutcome]:
        calls = [one(RolloutRequest(task, i, version, seed_of(i))) for i in range(k)]
        return list(await asyncio.gather(*calls, return_exceptions=True))

    return group


def group_from_sampler(sampler: Callable[[Sequence[Task], int], list[list[Rollout]]]) -> GroupFn:
    """A batch sampler ``(tasks, k) -> groups`` called for one row at a time, off the event loop.
    A sampler that takes a ``seeds`` keyword gets each sample's seed (``seeds[0][i]``), derived from
    the row's coordinates, so its draws never depend on the order calls arrive in."""
    takes_seeds = _accepts_keyword(sampler, "seeds")

    async def group(task: Task, k: int, version: int, seed_of: Callable[[int], int]) -> list[SampleOutcome]:
        kwargs = {"seeds": [[seed_of(i) for i in range(k)]]} if takes_seeds else {}
        groups = await asyncio.to_thread(sampler, [task], k, **kwargs)
        if not isinstance(groups, (list, tuple)) or len(groups) != 1:
            raise RLLoopError(f"sampler returned {len(groups) if isinstance(groups, (list, tuple)) else groups!r}"
                             f" groups for 1 task ({task.id!r})")
        if len(groups[0]) != k:
            raise RLLoopError(f"sampler returned {len(groups[0])} rollouts for task {task.id!r}, expected {k}")
        return list(groups[0])

    return group


def _accepts_keyword(fn: Callable[..., Any], name: str) -> bool:
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in parameters and parameters[name].kind in (inspect.Parameter.KEYWORD_ONLY,
                                                             inspect.Parameter.POSITIONAL_OR_KEYWORD)
