"""``python -m rlvr.cli``: the ``rlvr`` command."""

import sys

from rlvr.cli.commands import main

sys.exit(main())
