"""Rollouts: from an admitted row to a scored, filtered batch.

``episodes`` (single- and multi-turn rollout functions) · ``admission`` (the staleness rule, a pure
state machine) · ``stream`` (its asyncio driver) · ``checks`` (what a sample must satisfy before it is
trained on) · ``advantages`` (group-relative estimators). Standard library only.
"""
