"""Environments of the ``verifiers`` package (classic API: ``vf.SingleTurnEnv``, ``vf.MultiTurnEnv``,
``vf.ToolEnv`` with a ``vf.Rubric``), run by rlvr as their authors wrote them (the ``verifiers`` extra).

How a user names one: ``task.env = "verifiers:ENV_ID"`` (an installed environment package,
loaded by ``vf.load_environment(ENV_ID, **task.env_args)``), ``task.env = "verifiers"`` with
``env_args = {env_id = ...}``, or a module or file whose ``load_environment()`` returns a verifiers
environment. Rows come from the environment's own dataset (built lazily, on first use), or from
the data URI ``task.data = "[train|eval@]verifiers:ENV_ID[?limit=N]"`` (:mod:`.data`).

- :mod:`.env`: :class:`VerifiersEnv` (rows, ``reward_fn``) and :class:`VerifiersMultiTurnEnv`
  (``interact`` over the environment's ``env_response`` and ``is_completed``; its tools as
  ``tool_schemas``, which the chat template renders into every prompt).
- :mod:`.messages`: rows, answers, tool calls and replies between rlvr and verifiers.
- :mod:`.runner`: the private event loop verifiers' coroutines run on.

``verifiers.v1`` environments (``vf.Env`` with tasksets and harnesses: verifiers 0.4 has only
these) are agent-oriented and not supported. Standard library only at import; ``verifiers`` is
imported when an environment is loaded.
"""

from rlvr.envs.graders.verifiers_adapter.data import is_verifiers_spec, verifiers_tasks
from rlvr.envs.graders.verifiers_adapter.env import (
    EXTRA,
    VerifiersEnv,
    VerifiersMultiTurnEnv,
    from_verifiers,
    load_environment,
)
from rlvr.envs.graders.verifiers_adapter.messages import parse_tool_calls, split_messages, unpack_answer

__all__ = ["EXTRA", "VerifiersEnv", "VerifiersMultiTurnEnv", "from_verifiers", "is_verifiers_spec",
           "load_environment", "parse_tool_calls", "split_messages", "unpack_answer", "verifiers_tasks"]
