"""The ``rlvr`` command makes torch's OpenMP threads sleep when idle (wiring/cpu_waits.py): set before
torch loads, inherited by every child, and a user's own ``OMP_WAIT_POLICY`` kept."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rlvr.wiring.cpu_waits import threads_sleep_when_idle
from support.child_env import child_env

PROBE = """
import os, subprocess, sys
from rlvr.cli import main
try:
    main(["--help"])
except SystemExit:
    pass
child = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('OMP_WAIT_POLICY'))"],
                       capture_output=True, text=True, check=True).stdout.strip()
print(os.environ.get("OMP_WAIT_POLICY"), "torch" in sys.modules, child)
"""


def test_unset_becomes_passive_and_a_users_choice_is_kept():
    environ: dict[str, str] = {}
    assert threads_sleep_when_idle(environ) == "PASSIVE" and environ == {"OMP_WAIT_POLICY": "PASSIVE"}
    mine = {"OMP_WAIT_POLICY": "ACTIVE"}
    assert threads_sleep_when_idle(mine) == "ACTIVE" and mine == {"OMP_WAIT_POLICY": "ACTIVE"}


@pytest.mark.parametrize("given, expected", [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_the_command_sets_it_before_torch_loads_and_its_children_inherit_it(given, expected):
    env = {k: v for k, v in child_env().items() if k != "OMP_WAIT_POLICY"}
    if given is not None:
        env["OMP_WAIT_POLICY"] = given
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-3:] == [expected, "False", expected]

