"""Rollout workers outside the training process: the worker itself (:mod:`.worker`, served over
HTTP by :mod:`.app` as ``rlvr rollout-worker``, or as a Ray actor by
:mod:`rlvr.backends.cluster.ray_rollouts`), its HTTP client (:mod:`.http_service`), the generator it
samples the policy's servers with (:mod:`.served`) and the rollout function it builds (:mod:`.setup`).
The adapter the loop sees is core: :mod:`rlvr.rollouts.remote`."""
