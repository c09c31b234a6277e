"""What the tests on a local Ray cluster share: Ray itself, or a skip that says how to get it.
``RLVR_REQUIRE_RAY=1`` (CI sets it) turns the skip into a failure, so a missing Ray cannot pass
unnoticed."""

from __future__ import annotations

import importlib.util
import os

import pytest


def require_ray() -> None:
    # Found, not imported: a run imports ray itself, after keeping its local cluster on loopback.
    if importlib.util.find_spec("ray") is None:
        if os.environ.get("RLVR_REQUIRE_RAY"):
            pytest.fail("RLVR_REQUIRE_RAY is set but Ray is not installed: pip install 'rlvr[ray]'")
        pytest.skip("no Ray: pip install 'rlvr[ray]' to run the Ray cluster tests")
