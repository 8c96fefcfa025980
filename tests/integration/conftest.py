# conftest.py — runs real `./grpod serve` processes for the integration tests: a free loopback
# port, a temp data dir, the embedded tiny model, CPU backend. Skips only while the daemon's
# CLI is missing (`./grpod serve --help` without --data-dir).
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest
import requests

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GRPOD = os.environ.get("GRPOD_BIN", os.path.join(ROOT, "grpod"))


def have_serve():
    if not os.access(GRPOD, os.X_OK):
        return False
    try:
        r = subprocess.run([GRPOD, "serve", "--help"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0 and "--data-dir" in r.stdout + r.stderr


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Daemon:
    """One grpod process. start() waits for /readyz 200; stop() SIGTERMs and returns the exit code."""

    def __init__(self, data_dir, args=(), env=None):
        self.data_dir = data_dir
        self.args = list(args)
        self.env = dict(os.environ, **(env or {}))
        self.env.pop("NOTIFY_SOCKET", None)
        self.proc = None
        self.logs = []
        self.wrap = []          # a command the daemon runs under (e.g. unshare), its argv appended
        self.binary = GRPOD     # or build/grpod-test-hooks

    def start(self, wait_ready=True, preexec_fn=None):
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.log = tempfile.TemporaryFile(mode="w+")
        self.logs.append(self.log)
        self.proc = subprocess.Popen(
            [*self.wrap, self.binary, "serve", "--data-dir", self.data_dir, "--listen", "127.0.0.1:%d" % self.port,
             "--backend", "cpu", "--engine-threads", "2", *self.args],
            cwd=ROOT, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.log,
            preexec_fn=preexec_fn)
        if wait_ready:
            self.wait_ready()
        return self

    def wait_ready(self, timeout=60):
        end = time.time() + timeout
        while time.time() < end:
            if self.proc.poll() is not None:
                raise AssertionError("grpod exited %s:\n%s" % (self.proc.returncode, self.stderr()))
            try:
                if requests.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.05)
        raise AssertionError("grpod not ready in %ds:\n%s" % (timeout, self.stderr()))

    def stderr(self):
        out = []
        for f in self.logs:
            f.flush()
            f.seek(0)
            out.append(f.read())
        return "".join(out)

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout)
            if rc is not None and rc < 0:   # killed by a signal at stop: what it said (pytest shows it on failure)
                print("daemon exited on signal %d; the end of its stderr:\n%s" % (-rc, self.stderr()[-3000:]))
            return rc
        finally:
            if self.proc.poll() is None:
                self.proc.kill()

    def kill9(self):
        self.proc.kill()
        self.proc.wait(10)

    # HTTP helpers
    def get(self, path, **kw):
        return requests.get(self.url + path, timeout=kw.pop("timeout", 90), **kw)

    def post(self, path, body=None, **kw):
        # POST needs Content-Type: application/json (api/guard.h); raw bodies get it too
        kw["headers"] = dict({"Content-Type": "application/json"}, **kw.get("headers", {}))
        if body is not None and not isinstance(body, (bytes, str)):
            kw["json"] = body
        elif body is not None:
            kw["data"] = body
        return requests.post(self.url + path, timeout=kw.pop("timeout", 90), **kw)

    def delete(self, path, **kw):
        return requests.delete(self.url + path, timeout=90, **kw)

    def submit(self, path, body):
        r = self.post(path, body)
        assert r.status_code == 202, (r.status_code, r.text)
        return r.json()["job_id"]

    def wait_job(self, job_id, timeout=120):
        end = time.time() + timeout
        while time.time() < end:
            r = self.get("/v1/jobs/%s?wait=30" % job_id)
            assert r.status_code == 200, r.text
            j = r.json()
            if j["status"] not in ("queued", "running"):
                return j
        raise AssertionError("job %s not finished" % job_id)


def daemon_with_template(root, name, template):
    """A started daemon on a copy (root/name) of the embedded model whose tokenizer_config.json
    has chat_template template; its bos_token (a string, or "") as d.bos."""
    first = Daemon(str(root / "data0")).start()
    first.stop()
    model = root / name
    shutil.copytree(os.path.join(first.data_dir, "default-model"), str(model))
    cfg_path = model / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = template
    cfg_path.write_text(json.dumps(cfg))
    d = Daemon(str(root / "data"), ["--model", str(model)]).start()
    d.bos = cfg.get("bos_token") if isinstance(cfg.get("bos_token"), str) else ""
    return d


def rendered(d, body):
    """The chat prompt text d renders for body (messages, tools, ...): /tokenize then /detokenize."""
    t = d.post("/tokenize", body)
    assert t.status_code == 200, t.text
    return d.post("/detokenize", {"tokens": t.json()["tokens"]}).json()["prompt"]


@pytest.fixture(scope="session")
def grpod_available():
    if not have_serve():
        pytest.skip("./grpod serve is not built yet")


@pytest.fixture
def make_daemon(grpod_available, tmp_path):
    made = []

    def make(data_dir=None, args=(), env=None, start=True):
        d = Daemon(str(data_dir or tmp_path / "data"), args, env)
        made.append(d)
        return d.start() if start else d
    yield make
    for d in made:
        if d.proc and d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait(10)


@pytest.fixture(scope="module")
def shared_daemon(grpod_available, tmp_path_factory):
    """One daemon for the read-mostly tests of a module (saves start-ups)."""
    d = Daemon(str(tmp_path_factory.mktemp("shared") / "data")).start()
    yield d
    d.stop()
    if d.proc.poll() is None:
        d.proc.kill()
