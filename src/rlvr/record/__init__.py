"""The run folder, written and read, torch-free: what is in a run's record.

``run_record`` (run.json, events, metrics, samples: the recorder and :func:`read_record`) ·
``checkpoints`` (the checkpoint folders a resume can trust) · ``run_folder`` (when ``rlvr train`` may
use a folder, what a failed start leaves) · ``sinks`` (metric trackers fed from the record) · ``gain``
(how a change in score is said) · ``history`` (earlier runs read back) · ``lineage`` (what a model
folder was trained on) · ``report`` and ``plots`` (the page ``rlvr report`` makes from the files alone).
Standard library (+ matplotlib, lazily, for plots).
"""

from rlvr.record.run_record import RunRecord, RunRecorder, read_record, strip_timing

__all__ = ["RunRecord", "RunRecorder", "read_record", "strip_timing"]
