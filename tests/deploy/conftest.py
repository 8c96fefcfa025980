# conftest.py — shared helpers for tests/deploy: where the repo and the built binary are, and
# whether `grpod serve --help` exists yet (tests that need the daemon skip only while it doesn't).
import os
import subprocess

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GRPOD = os.path.join(ROOT, "grpod")


def serve_help():
    """`./grpod serve --help` text, or None when the daemon's CLI is not there yet."""
    if not os.access(GRPOD, os.X_OK):
        return None
    try:
        r = subprocess.run([GRPOD, "serve", "--help"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = r.stdout + r.stderr
    if r.returncode != 0 or "--data-dir" not in text:
        return None
    return text


@pytest.fixture(scope="session")
def help_text():
    t = serve_help()
    if t is None:
        pytest.skip("`./grpod serve --help` does not exist yet (daemon/serve.c not landed)")
    return t
