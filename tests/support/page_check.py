"""Open a report page in headless Chromium and read back which images loaded.

Chromium is a Debian package (``make system-deps`` installs it). Without it the tests that need it
skip, saying so; ``RLVR_REQUIRE_CHROMIUM=1`` (CI sets it) turns that skip into a failure.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

# Marks each image once the page has loaded: loaded means decoded with a real width.
_MARKER = """<script>window.addEventListener("load", () => { for (const img of document.images)
  img.setAttribute("data-loaded", img.complete && img.naturalWidth > 0 ? "yes" : "no"); });</script>"""


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    if os.environ.get("RLVR_REQUIRE_CHROMIUM"):
        pytest.fail("RLVR_REQUIRE_CHROMIUM is set but no chromium was found (apt-get install chromium)")
    pytest.skip("no chromium: apt-get install chromium (make system-deps) to check the report page in a browser")


def loaded_images(page: Path) -> dict[str, str]:
    """``src -> "yes" | "no"`` for every ``img`` of ``page`` as headless Chromium rendered it."""
    probe = page.with_name(".page_check.html")  # beside the page, so relative image paths resolve
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", _MARKER + "</body>"), encoding="utf-8")
    try:
        out = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu",
                              "--allow-file-access-from-files", "--virtual-time-budget=5000", "--dump-dom",
                              probe.as_uri()],
                             capture_output=True, text=True, timeout=120)
    finally:
        probe.unlink()
    assert out.returncode == 0, out.stderr[-2000:]
    images = {}
    for tag in re.findall(r"<img\b[^>]*>", out.stdout):
        src = re.search(r'src="([^"]*)"', tag)
        state = re.search(r'data-loaded="(\w+)"', tag)
        images[src.group(1) if src else "?"] = state.group(1) if state else "not marked"
    return images
