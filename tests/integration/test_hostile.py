# test_hostile.py — issue 20: inputs that crashed, hung or bloated the daemon, each answered now
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


MODEL_DEFECTS = {
    "tokenizer_id_past_vocab": ("tokenizer.json", tok_id_past_vocab, ["vocab_size"]),
}


@pytest.mark.parametrize("name", sorted(MODEL_DEFECTS))
def test_broken_model_dir(default_model, tmp_path, name):
    file, fn, words = MODEL_DEFECTS[name]
    d = broken_copy(default_model, tmp_path, name, lambda d: edit_json(d, file, fn) if file.endswith(".json") else fn(d))
    assert_one_line_error(info(d), *words)
