# test_hostile.py — inputs that crashed, hung or bloated the daemon, each answered now
# with a clear 4xx/5xx (or a one-line error for a model directory) while /healthz still answers.
# Model directories are built here from the embedded default model, one defect each.
import json
import os
import shutil
import subprocess

import pytest

from conftest import GRPOD

JSON = {"Content-Type": "application/json"}


def nested(open_, mid, close, depth):
    return open_ * depth + mid + close * depth


def post_raw(d, path, body, timeout=120):
    return d.post(path, json.dumps(body).encode(), headers=JSON, timeout=timeout)


# Each body was a crash or an unbounded cost before; now a 4xx naming the field.
BOMBS = [
    # 1 MB math answer nesting \frac 100,000 deep: SIGSEGV after 52 s (recursion + quadratic scan)
    ({"groups": [{"prompt": "a", "reward": {"type": "math",
                                            "answer": nested("\\frac{", "1", "}{2}", 100000)}}]},
     "groups[0].reward.answer"),
    ({"groups": [{"prompt": "a", "reward": {"type": "math", "answer": nested("\\boxed{", "x", "}", 150000)}}]},
     "groups[0].reward.answer"),
]


@pytest.mark.parametrize("body,field", BOMBS, ids=[str(i) for i in range(len(BOMBS))])
def test_request_bombs(shared_daemon, body, field):
    d = shared_daemon
    r = post_raw(d, "/v1/rollouts", body)
    assert r.status_code == 400, (r.status_code, r.text[:300])
    assert r.json()["error"]["field"] == field
    assert d.get("/healthz", timeout=10).status_code == 200


def test_json_value_bombs(shared_daemon):
    """8 MiB of empty objects made json-c allocate 2.2 GB (~800 bytes per "{}"): refused with 413
    before parsing. A body of the same size whose numbers are token ids is packed and parsed."""
    d = shared_daemon
    n = (8 << 20) // 3 - 16
    r = d.post("/v1/updates", ('{"groups":[' + ",".join(["{}"] * n) + "]}").encode(), headers=JSON, timeout=120)
    assert r.status_code == 413 and "too many JSON values" in r.json()["error"]["message"], r.text[:300]
    ids = ",".join(["7"] * 2000)
    g = '{"prompt_ids":[%s],"responses":[{"token_ids":[%s],"reward":1},{"token_ids":[%s],"reward":0}]}' % (ids, ids, ids)
    r = d.post("/v1/updates", ('{"expected_policy_version":999,"groups":[' + ",".join([g] * ((8 << 20) // len(g) - 1)) +
                               "]}").encode(), headers=JSON, timeout=120)
    assert r.status_code == 409 and r.json()["error"]["field"] == "expected_policy_version", r.text[:300]
    assert d.get("/healthz", timeout=10).status_code == 200


def test_micro_batch_bound(shared_daemon):
    d = shared_daemon
    g = [{"prompt_ids": [1], "responses": [{"token_ids": [2], "reward": 1}]}]
    for path in ("/v1/updates", "/v1/logprobs"):
        r = post_raw(d, path, {"groups": g, "max_tokens_per_micro_batch": 2 ** 32})
        assert r.status_code == 400 and r.json()["error"]["field"] == "max_tokens_per_micro_batch", r.text


# ---------------------------------------------------------------- model directories


@pytest.fixture(scope="module")
def default_model(grpod_available, tmp_path_factory):
    data = tmp_path_factory.mktemp("dm")
    r = subprocess.run([GRPOD, "info", "--data-dir", str(data)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return str(data / "default-model")


def broken_copy(default_model, tmp_path, name, edit):
    d = str(tmp_path / name)
    shutil.copytree(default_model, d)
    edit(d)
    return d


def edit_json(d, file, fn):
    p = os.path.join(d, file)
    with open(p) as f:
        j = json.load(f)
    fn(j)
    with open(p, "w") as f:
        json.dump(j, f)


def info(model_dir):
    return subprocess.run([GRPOD, "info", "--model", model_dir], capture_output=True, text=True, timeout=120)


def assert_one_line_error(r, *words):
    assert r.returncode == 1, (r.returncode, r.stderr[-500:])    # an error, not a signal
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("grpod: "), r.stderr[-500:]
    for w in words:
        assert w in lines[0], lines[0]


def tok_id_past_vocab(j):
    j["model"]["vocab"]["zz-beyond"] = 100000


def set_cfg(**kw):
    return lambda j: j.update(kw)


def raw_cfg(key, text):
    """config.json with key set to a literal the json module will not write (NaN, 1e400)."""
    def edit(d):
        p = os.path.join(d, "config.json")
        with open(p) as f:
            j = json.load(f)
        j[key] = "@@"
        with open(p, "w") as f:
            f.write(json.dumps(j).replace('"@@"', text))
    return edit


def st_edit(fn):
    """Rewrites model.safetensors' header with fn(header dict, data bytearray)."""
    def edit(d):
        p = os.path.join(d, "model.safetensors")
        with open(p, "rb") as f:
            b = f.read()
        n = int.from_bytes(b[:8], "little")
        h = json.loads(b[8:8 + n])
        data = bytearray(b[8 + n:])
        fn(h, data)
        hb = json.dumps(h).encode()
        hb += b" " * (-len(hb) % 8)
        with open(p, "wb") as f:
            f.write(len(hb).to_bytes(8, "little") + hb + bytes(data))
    return edit


def tensors(h):
    return sorted((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"][0])


def st_overlap(h, data):
    a, b = tensors(h)[:2]
    h[b]["data_offsets"] = list(h[a]["data_offsets"])
    h[b]["shape"] = list(h[a]["shape"])


def st_fractional(h, data):
    t = tensors(h)[0]
    h[t]["data_offsets"] = [0.5, h[t]["data_offsets"][1] + 0.5]


def st_numel_overflow(h, data):
    t = tensors(h)[0]
    h[t]["shape"] = [2 ** 20] * 4         # each dim plausible, the product 2^80


def st_nan(h, data):
    t = tensors(h)[-1]
    o = h[t]["data_offsets"][0]
    data[o + 4:o + 8] = b"\x00\x00\xc0\x7f"          # a float32 NaN, second element


def long_merge(j):
    j["model"]["merges"] = ["b" * 70000 + " " + "c" * 70000]


def long_key(j):
    vocab = j["model"]["vocab"]
    k = next(k for k, v in vocab.items() if v == 5)
    del vocab[k]
    vocab["a" * 70000] = 5


# name: (file, edit, words the one-line error must hold); None = may load (no crash either way)
MODEL_DEFECTS = {
    "tokenizer_id_past_vocab": ("tokenizer.json", tok_id_past_vocab, ["vocab_size"]),
    "tokenizer_long_merge": ("tokenizer.json", long_merge, ["merge 0"]),
    "tokenizer_long_key": ("tokenizer.json", long_key, None),
    "layers_2e28": ("config.json", set_cfg(num_hidden_layers=268435456), ["num_hidden_layers"]),
    "layers_fraction": ("config.json", set_cfg(num_hidden_layers=1.5), ["num_hidden_layers"]),
    "head_dim_2e9": ("config.json", set_cfg(head_dim=2e9), ["head_dim"]),
    "hidden_1e300": ("config.json", set_cfg(hidden_size=1e300), ["hidden_size"]),
    "max_pos_negative": ("config.json", set_cfg(max_position_embeddings=-5), ["max_position_embeddings"]),
    "max_pos_1e12": ("config.json", set_cfg(max_position_embeddings=1e12), ["max_position_embeddings"]),
    "kv_heads_0": ("config.json", set_cfg(num_key_value_heads=0), ["num_key_value_heads"]),
    "vocab_huge": ("config.json", set_cfg(vocab_size=2 ** 40), ["vocab_size"]),
    "eps_nan": (None, raw_cfg("rms_norm_eps", "NaN"), ["config.json"]),
    "eps_negative": ("config.json", set_cfg(rms_norm_eps=-1e-6), ["rms_norm_eps"]),
    "rope_theta_inf": (None, raw_cfg("rope_theta", "1e400"), ["rope_theta"]),
    "rope_theta_zero": ("config.json", set_cfg(rope_theta=0), ["rope_theta"]),
    "intermediate_big": ("config.json", set_cfg(intermediate_size=200000), ["has shape"]),
    "st_overlap": (None, st_edit(st_overlap), ["overlaps"]),
    "st_fractional": (None, st_edit(st_fractional), ["data_offsets"]),
    "st_numel_overflow": (None, st_edit(st_numel_overflow), ["more elements"]),
    "st_nan_weight": (None, st_edit(st_nan), ["non-finite"]),
}


@pytest.mark.parametrize("name", sorted(MODEL_DEFECTS))
def test_broken_model_dir(default_model, tmp_path, name):
    file, fn, words = MODEL_DEFECTS[name]
    d = broken_copy(default_model, tmp_path, name, (lambda d: edit_json(d, file, fn)) if file else fn)
    r = info(d)
    if words is None:
        assert r.returncode in (0, 1), (r.returncode, r.stderr[-500:])
        if r.returncode:
            assert_one_line_error(r)
    else:
        assert_one_line_error(r, *words)


# ---------------------------------------------------------------- web origins, keys, signals


def raw_post(d, path, data, headers):
    import requests
    return requests.post(d.url + path, data=data, headers=headers, timeout=60)


def test_cross_origin_refused(shared_daemon):
    d = shared_daemon
    body = json.dumps({"groups": [{"prompt": "a"}], "sampling": {"max_tokens": 1}})
    # a page's text/plain POST (no CORS preflight): 415, before anything is queued
    r = raw_post(d, "/v1/rollouts", body, {"Content-Type": "text/plain"})
    assert r.status_code == 415 and r.json()["error"]["field"] == "Content-Type", r.text
    r = raw_post(d, "/v1/rollouts", body, {})
    assert r.status_code == 415, r.text
    # the same with JSON but from another origin: 403
    r = raw_post(d, "/v1/rollouts", body, {"Content-Type": "application/json", "Origin": "http://evil.example"})
    assert r.status_code == 403 and r.json()["error"]["field"] == "Origin", r.text
    r = raw_post(d, "/v1/tokenize", '{"prompt": "a"}', {"Content-Type": "text/plain", "Origin": "null"})
    assert r.status_code == 403, r.text
    # DNS rebinding: the attacker's name in Host
    r = d.get("/v1/model", headers={"Host": "evil.example:%d" % d.port})
    assert r.status_code == 403 and r.json()["error"]["field"] == "Host", r.text
    for host in ("localhost:%d" % d.port, "127.0.0.1", "[::1]:%d" % d.port, "LOCALHOST."):
        assert d.get("/v1/model", headers={"Host": host}).status_code == 200, host
    r = raw_post(d, "/v1/tokenize", '{"prompt": "a"}', {"Content-Type": "Application/JSON; charset=utf-8"})
    assert r.status_code == 200, r.text
    assert d.get("/healthz").status_code == 200


def test_allowed_hosts_and_origins(make_daemon):
    d = make_daemon(args=["--allowed-hosts", "grpod.internal", "--allowed-origins", "https://app.example"])
    assert d.get("/v1/model", headers={"Host": "grpod.internal:%d" % d.port}).status_code == 200
    assert d.get("/v1/model", headers={"Host": "other.internal"}).status_code == 403
    r = d.post("/v1/tokenize", {"prompt": "a"}, headers={"Origin": "https://app.example"})
    assert r.status_code == 200, r.text
    assert d.post("/v1/tokenize", {"prompt": "a"}, headers={"Origin": "https://app.example.evil"}).status_code == 403


def test_api_key_bearer_case_and_sighup_reload(make_daemon, tmp_path):
    import signal
    import time
    key = tmp_path / "key"
    key.write_text("first-key-1234\n")
    d = make_daemon(args=["--api-key-file", str(key)])
    assert d.get("/v1/model", headers={"Authorization": "bearer first-key-1234"}).status_code == 200
    assert d.get("/v1/model", headers={"Authorization": "BEARER  first-key-1234"}).status_code == 200
    assert d.get("/v1/model", headers={"Authorization": "Bearer first-key-123"}).status_code == 401
    assert d.get("/v1/model", headers={"Authorization": "Bearer first-key-12345"}).status_code == 401
    key.write_text("second-key-5678\n")
    d.proc.send_signal(signal.SIGHUP)
    ok = False
    for _ in range(100):                     # bounded: the reload is applied on the main loop
        if d.get("/v1/model", headers={"Authorization": "Bearer second-key-5678"}).status_code == 200:
            ok = True
            break
        time.sleep(0.1)
    assert ok, d.stderr()[-2000:]
    assert d.get("/v1/model", headers={"Authorization": "Bearer first-key-1234"}).status_code == 401
    key.write_text("")                       # a broken key file keeps the current key
    d.proc.send_signal(signal.SIGHUP)
    for _ in range(100):
        if "api_key_reload_failed" in d.stderr():
            break
        time.sleep(0.1)
    assert "api_key_reload_failed" in d.stderr()
    assert d.get("/v1/model", headers={"Authorization": "Bearer second-key-5678"}).status_code == 200


def test_second_sigterm_logged(make_daemon):
    import signal
    import time
    d = make_daemon()
    # a long rollout keeps the engine busy while the daemon drains
    jid = d.submit("/v1/rollouts", {"groups": [{"prompt": "a", "n": 1}],
                                    "sampling": {"max_tokens": 600, "ignore_eos": True}})
    for _ in range(600):
        if d.get("/v1/jobs/" + jid).json()["status"] == "running":
            break
        time.sleep(0.05)
    d.proc.send_signal(signal.SIGTERM)
    for _ in range(1000):                    # the second one as soon as the first is handled
        if '"stopping"' in d.stderr():
            break
        time.sleep(0.01)
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(300) == 0
    log = d.stderr()
    # the second signal lands while the rollout drains (it runs for seconds on the CPU backend)
    assert '"signal_again"' in log, log[-2000:]


# ---------------------------------------------------------------- slow clients


def test_slow_clients_cannot_take_it_offline(make_daemon):
    import socket
    import time
    d = make_daemon(args=["--max-connections", "64", "--max-connections-per-client", "40", "--request-timeout", "3"])
    slow = []
    for _ in range(150):                     # far past both caps, all from 127.0.0.1
        s = socket.create_connection(("127.0.0.1", d.port), timeout=10)
        s.sendall(b"GET /healthz HTTP/1.1\r\nHo")
        slow.append(s)
    for _ in range(5):                       # probes are served while the flood holds the caps
        assert d.get("/healthz", timeout=20).status_code == 200
        assert d.get("/readyz", timeout=20).status_code == 200
    # a Content-Length larger than the body, and a client dribbling a byte every 0.3 s: both are
    # closed once the request deadline (3 s, not reset per byte) passes
    pinned = socket.create_connection(("127.0.0.1", d.port), timeout=10)
    pinned.sendall(b"POST /v1/tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                   b"Content-Length: 100\r\n\r\n{")
    drip = socket.create_connection(("127.0.0.1", d.port), timeout=10)
    closed = False
    end = time.time() + 60
    while time.time() < end and not closed:
        try:
            drip.sendall(b"X")
            drip.settimeout(0.3)
            closed = drip.recv(64) == b""
        except socket.timeout:
            pass
        except OSError:
            closed = True
    assert closed, "a dribbling client kept its connection for 60 s"
    pinned.settimeout(60)
    try:
        got = pinned.recv(4096)
    except OSError:
        got = b""
    assert got == b"" or got.startswith(b"HTTP/1.1 4"), got[:200]
    for s in slow + [pinned, drip]:
        s.close()
    assert d.get("/healthz", timeout=20).status_code == 200
