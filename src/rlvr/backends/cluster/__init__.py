"""Cluster engines: the servers and reward workers rlvr starts, as Ray actors (imports ray, except actor_pool)."""
