"""Multi-turn environments (retry, tools, retrieval); the answer checks they share live in :mod:`rlvr.envs.answers`."""
