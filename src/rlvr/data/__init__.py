"""Data: rows from files and datasets (``readers``), rows to tasks, the frozen split and the cursor (``tasks``)."""
