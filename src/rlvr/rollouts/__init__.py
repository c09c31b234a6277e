"""Rollouts: from an admitted row to a scored, filtered batch.

``episodes`` (single- and multi-turn rollout functions) · ``admission`` (the staleness rule, a pure
state machine) · ``stream`` (its asyncio driver) · ``checks`` (what a sample must satisfy before it is
trained on). The advantage estimators are :mod:`rlvr.algos.advantages`. Standard library only.
"""
