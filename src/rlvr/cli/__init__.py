"""The ``rlvr`` command and the composition root.

``commands`` (argument parsing, one function per subcommand) · ``settings`` (the TOML run config) ·
``wiring`` (config → backends → seams → loop: the only place that picks backends) · ``warm_start``
(the base model and its SFT warm start) · ``export``. Backends are imported lazily, so ``rlvr --help``
works without torch.
"""

from rlvr.cli.commands import main

__all__ = ["main"]
