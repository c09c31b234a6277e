"""The ways in: the ``rlvr`` command, its subcommands, ``rlvr.train`` and the queue.

``commands`` (argument parsing, one function per subcommand) · ``notebook`` and ``inputs``
(``rlvr.train`` from Python) · ``evaluate`` · ``export`` and ``model_card`` · ``proxy`` · ``queue``
(with ``queue_summary``; its pre-flight is
:mod:`rlvr.wiring.queue_preflight`) · ``progress`` (the live display). The run's config is
:mod:`rlvr.config`, its composition root :mod:`rlvr.wiring`. Backends are imported lazily, so ``rlvr
--help`` works without torch.
"""

from rlvr.cli.commands import main

__all__ = ["main"]
