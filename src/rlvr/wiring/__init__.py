"""The composition root: where a run's backends are picked, and the only place that picks them.

A :class:`~rlvr.config.run.RunConfig` becomes backends, seams and a loop here. ``seams`` (config →
sampler, trainer, weight sync, evaluator, loop) · ``base`` (the base model as loaded or built, and its
warm start) · ``levers`` (the loss, schedule and shaping the ``[train]`` section asks for) ·
``preflight`` (what is checked before anything is written) · ``fields``, ``eval_sets``, ``agents``,
``reward_models``, ``user_algos``, ``adapter_init`` (what the task and algorithm sections name) ·
``watchdog`` · ``runs`` (earlier runs: "has this been tried") · ``cpu_waits`` · ``scale/`` (fan-out
over servers, colocated vLLM, sharding, Ray, remote rollout workers, trainer ranks). Backend modules
are imported lazily, inside the functions that need them, so importing this package needs no torch.
"""
