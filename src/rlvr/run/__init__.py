"""A run: the loop and what it decides.

``loop`` (control flow) · ``inputs`` (what the loop is given: LoopSeams, LoopOptions, EnvPlan) ·
``step_metrics`` (a train step's figures) · ``scores`` and ``run_info`` (the scores beside the gate,
the summary; run.json) · ``checkpointing`` and ``resume`` (checkpoints written whole; resuming a
folder) · ``gate`` (held-out selection) · ``evaluation`` (held-out scoring) · ``advice`` (warnings a
run gives about itself) · ``hooks`` (progress and abort) · ``memory`` and ``watchdog`` (memory trace,
clean stop before the OOM killer) · ``passk`` (pass@k for ``rlvr eval``). The run folder these write
is :mod:`rlvr.record`. Standard library + pydantic only.
"""
