"""A run over more than one process or machine: ``fanout`` (several inference servers) · ``colocate``
(vLLM in the training process) · ``sharding`` (FSDP trainer ranks) · ``cluster`` (Ray actors) ·
``rollout_workers`` (remote rollout workers) · ``ranks`` and ``ray_ranks`` (trainer ranks under
torchrun or Ray)."""
