"""A run: the loop and what it owns.

``loop`` (control flow) · ``gate`` (held-out selection) · ``evaluation`` (held-out scoring) ·
``record`` (the run folder and the checkpoint layout) · ``hooks`` (progress and abort) · ``memory``.
Standard library + pydantic only.
"""
