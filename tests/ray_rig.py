"""What the tests on a local Ray cluster share: Ray itself, or a skip that says how to get it.
``RLVR_REQUIRE_RAY=1`` (CI sets it) turns the skip into a failure, so a missing Ray cannot pass
unnoticed."""

from __future__ import annotations

import os

import pytest


def require_ray() -> None:
    try:
        import ray  # noqa: F401
    except ImportError as exc:
        if os.environ.get("RLVR_REQUIRE_RAY"):
            pytest.fail(f"RLVR_REQUIRE_RAY is set but Ray cannot be imported ({exc}): pip install 'rlvr[ray]'")
        pytest.skip(f"no Ray ({exc}): pip install 'rlvr[ray]' to run the Ray cluster tests")
