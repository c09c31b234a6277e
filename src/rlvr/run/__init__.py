"""A run: the loop and what it decides.

``loop`` (control flow) · ``gate`` (held-out selection) · ``evaluation`` (held-out scoring) · ``advice``
(warnings a run gives about itself) · ``hooks`` (progress and abort) · ``memory`` and ``watchdog``
(memory trace, clean stop before the OOM killer) · ``passk`` (pass@k for ``rlvr eval``). The run folder
these write is :mod:`rlvr.record`. Standard library + pydantic only.
"""
