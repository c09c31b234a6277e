"""The coding task: small procedural repositories with a planted bug, edited by an agent, judged by
their own tests in the Python sandbox.

``repos`` (the rows) · ``edits`` (the edit format and what an edit may touch) · ``runner`` (the
tests in the sandbox) · ``env`` (:class:`CodingEnv`, the reward). ``task.env = "coding"`` names it.
Standard library only.
"""

from __future__ import annotations

from rlvr.envs.coding.edits import Edit, EditRefused, apply_edits, parse_edits
from rlvr.envs.coding.env import CodingEnv, agent_view, load_environment
from rlvr.envs.coding.repos import make_rows, view
from rlvr.envs.coding.runner import TestReport, TestRunner

__all__ = ["CodingEnv", "Edit", "EditRefused", "TestReport", "TestRunner", "agent_view", "apply_edits",
           "load_environment", "make_rows", "parse_edits", "view"]
