"""``task.fields`` and ``task.answer_extract`` as one :class:`~rlvr.data.fields.FieldMap`, built the same
way for a run's rows, its external eval sets and ``rlvr eval --data``: every table of rows a section
reads goes through the same mapping. Part of the composition root (imports a function extractor).
"""

from __future__ import annotations

from rlvr.config.run import TaskSection
from rlvr.data.fields import FieldMap
from rlvr.envs.loading import load_object
from rlvr.errors import ConfigError, DataError


def field_map(t: TaskSection) -> FieldMap | None:
    """``task.fields`` and ``task.answer_extract`` as a :class:`~rlvr.data.fields.FieldMap` (``None``
    when neither is set: rows in rlvr's own schema); a function extractor is imported here."""
    if not t.fields and t.answer_extract is None:
        return None
    try:
        return FieldMap.build(t.fields, t.answer_extract, load=load_object)
    except DataError as exc:
        raise ConfigError(f"task.{exc}") from None
