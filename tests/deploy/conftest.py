# conftest.py — the fixture tests/deploy share: `grpod serve --help` text; tests that need the
# daemon skip only while that command does not exist yet (daemon/serve.c not landed).
import pytest

from deploy_util import serve_help


@pytest.fixture(scope="session")
def help_text():
    t = serve_help()
    if t is None:
        pytest.skip("`./grpod serve --help` does not exist yet (daemon/serve.c not landed)")
    return t
