# test_http_conventions.py — the HTTP details clients and proxies rely on: HEAD on every GET
# route, Retry-After on 429/503, WWW-Authenticate on 401, a `null` body named as such,
# /healthz 503 on connections open during the drain; and the CLI's --version and detokenize
# errors (same rule as POST /v1/detokenize: an id outside the vocabulary is an error).
import http.client
import os
import signal
import subprocess
import time

import requests

from conftest import GRPOD, ROOT


def test_head_on_get_routes(shared_daemon):
    d = shared_daemon
    for path in ("/healthz", "/readyz", "/metrics", "/openapi.json", "/v1/model", "/v1/jobs"):
        r = requests.head(d.url + path, timeout=30)
        assert r.status_code == 200, (path, r.status_code)
        assert r.content == b"", path
    assert requests.head(d.url + "/v1/rollouts", timeout=30).status_code == 405


def test_null_body_is_named(shared_daemon):
    r = shared_daemon.post("/v1/rollouts", "null", headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    assert "null" in r.json()["error"]["message"], r.text


HOLD_UPDATE = {"groups": [{"prompt_ids": [1, 2], "responses": [{"token_ids": [3], "reward": 1.0},
                                                             {"token_ids": [4], "reward": 0.0}]}]}


def fill_queue(d):
    """A long rollout runs, an update waits behind it (claimed, held): what comes next queues."""
    for path, body in (("/v1/rollouts", {"groups": [{"prompt": "x", "n": 8}],
                                         "sampling": {"max_tokens": 400, "ignore_eos": True, "seed": 1}}),
                       ("/v1/updates", HOLD_UPDATE)):
        jid = d.submit(path, body)
        end = time.time() + 60
        while d.get("/v1/jobs/" + jid).json()["status"] == "queued" and time.time() < end:
            time.sleep(0.02)


def test_retry_after_on_429(make_daemon):
    d = make_daemon(args=["--max-queued-jobs", "1"])
    fill_queue(d)
    body = {"groups": [{"prompt": "y", "n": 1}], "sampling": {"max_tokens": 1}}
    codes = []
    for _ in range(6):
        r = d.post("/v1/rollouts", body)
        codes.append(r.status_code)
        if r.status_code == 429:
            assert r.headers.get("Retry-After", "").isdigit(), r.headers
            break
    assert 429 in codes, codes


def test_www_authenticate_on_401(make_daemon, tmp_path):
    key = tmp_path / "key"
    key.write_text("s3cret-key-123\n")
    d = make_daemon(args=["--api-key-file", str(key)])
    r = d.get("/v1/model")
    assert r.status_code == 401
    assert r.headers.get("WWW-Authenticate", "").startswith("Bearer"), r.headers
    assert d.get("/v1/model", headers={"Authorization": "Bearer s3cret-key-123"}).status_code == 200


def test_healthz_503_during_drain(make_daemon):
    d = make_daemon()
    long = d.submit("/v1/rollouts", {"groups": [{"prompt": "x", "n": 8}],
                                     "sampling": {"max_tokens": 400, "ignore_eos": True, "seed": 1}})
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=30)
    conn.request("GET", "/healthz")
    r = conn.getresponse()
    r.read()
    assert r.status == 200
    end = time.time() + 30
    while d.get("/v1/jobs/" + long).json()["status"] == "queued" and time.time() < end:
        time.sleep(0.02)
    d.proc.send_signal(signal.SIGTERM)
    status, retry = None, None
    end = time.time() + 20
    while time.time() < end:       # the drain began once the same connection sees 503
        conn.request("GET", "/healthz")
        r = conn.getresponse()
        r.read()
        status, retry = r.status, r.getheader("Retry-After")
        if status == 503 or d.proc.poll() is not None:
            break
        time.sleep(0.02)
    conn.close()
    assert status == 503 and retry, (status, d.stderr()[-1500:])
    assert d.proc.wait(120) == 0


def test_cli_version_and_detokenize(tmp_path):
    r = subprocess.run([GRPOD, "--version"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout.startswith("grpod "), r
    data = str(tmp_path / "data")
    r = subprocess.run([GRPOD, "detokenize", "--data-dir", data, "--ids", "9707"], capture_output=True, text=True,
                       timeout=60, cwd=ROOT)
    assert r.returncode == 1 and "9707" in r.stderr and "vocabulary" in r.stderr, r
    r = subprocess.run([GRPOD, "detokenize", "--data-dir", data, "--ids", "72,105"], capture_output=True, text=True,
                       timeout=60, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.strip() == "Hi", r
    assert os.path.isdir(os.path.join(data, "default-model"))
