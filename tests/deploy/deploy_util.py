# deploy_util.py — helpers shared by tests/deploy (a uniquely named module: several test
# directories have a conftest.py, so `from conftest import ...` would be ambiguous).
import os
import subprocess

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GRPOD = os.path.join(ROOT, "grpod")
# The daemon with test hooks compiled in (make test builds it; the Makefile says which hooks).
GRPOD_TEST_HOOKS = os.path.join(ROOT, "build", "grpod-test-hooks")


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
