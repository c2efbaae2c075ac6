"""Browser tests: JupyterLab driven by a real headless Chromium (Debian's ``chromium``) through playwright.

playwright cannot download its own browsers here (no internet), so the tests
launch the system Chromium: ``GPULAB_CHROMIUM`` if set, else the first of
``chromium``, ``chromium-browser``, ``google-chrome`` on PATH. ``make install``
installs Debian's ``chromium`` (and ``fonts-noto-cjk``, for the Chinese text)
when apt is available. Without a browser the tests are skipped with a reason
that says so; ``GPULAB_REQUIRE_BROWSER=1`` (set it in CI) turns that skip into
a failure.
"""

from __future__ import annotations

import os
import shutil

import pytest

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "browser: drives JupyterLab in a real headless Chromium (playwright)")


def _missing(what: str) -> None:
    msg = (f"BROWSER TEST NOT RUN: {what}. Install Debian's Chromium with "
           "`sudo apt-get install -y chromium fonts-noto-cjk` (or `make install-test` as root, which `make test` runs), "
           "or point GPULAB_CHROMIUM at a Chromium binary.")
    if os.environ.get("GPULAB_REQUIRE_BROWSER") == "1":
        pytest.fail(msg + " (GPULAB_REQUIRE_BROWSER=1: a missing browser is an error)", pytrace=False)
    pytest.skip(msg)


@pytest.fixture(scope="session")
def chromium_path() -> str:
    """The system Chromium playwright launches (``executable_path``)."""
    wanted = os.environ.get("GPULAB_CHROMIUM")
    if wanted:
        if not (os.path.isfile(wanted) and os.access(wanted, os.X_OK)):
            _missing(f"GPULAB_CHROMIUM={wanted} is not an executable file")
        return wanted
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    _missing(f"no Chromium on PATH (looked for {', '.join(BROWSERS)})")
    raise AssertionError("unreachable")


@pytest.fixture(scope="session")
def sync_playwright():
    try:
        from playwright.sync_api import sync_playwright as sp
    except ImportError:
        _missing("the playwright Python package is not installed (`pip install -e '.[dev]'`)")
    return sp
