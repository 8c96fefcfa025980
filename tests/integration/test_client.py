# test_client.py — clients/python (grpod_client) against a real daemon: every helper once, the
# errors it raises (server code and field; JobFailed for a cancelled job), and the 429 retry
# that sleeps the server's Retry-After.
import os
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python"))
import grpod_client  # noqa: E402
from grpod_client import Client, GrpodError, JobFailed  # noqa: E402


def test_model_tokenizer_and_errors(shared_daemon):
    c = Client(shared_daemon.url)
    assert c.ready() and c.healthz()["status"] == "ok"
    m = c.model()
    assert m["vocab"] > 0 and m["policy_version"] >= 0
    ids = c.tokenize("Hi there")
    assert ids and c.detokenize(ids) == "Hi there"
    assert c.tokenize(messages=[{"role": "user", "content": "x"}])
    with pytest.raises(GrpodError) as ei:
        c.submit_rollouts([{"prompt": "x", "n": 100000}])
    e = ei.value
    assert (e.status, e.code, e.field) == (400, "invalid_field", "groups[0].n"), e
    with pytest.raises(GrpodError) as ei:
        c.job("j_0000000000000000")
    assert ei.value.status == 404 and ei.value.code == "not_found"
    assert "grpod_queue_depth" in c.metrics()


def test_rollout_update_logprobs_checkpoint(make_daemon):
    d = make_daemon()
    c = Client(d.url)
    ro = c.rollouts([{"prompt": "Repeat: a", "n": 4, "reward": {"type": "exact", "answer": "a"}}],
                    sampling={"max_tokens": 3, "seed": 5})
    assert ro.job_id.startswith("j_") and ro.policy_version == 0
    resp = ro["groups"][0]["responses"]
    assert len(resp) == 4 and all(len(r["token_ids"]) == len(r["logprobs"]) for r in resp)
    lp = c.logprobs([{"prompt_ids": ro["groups"][0]["prompt_ids"],
                      "responses": [{"token_ids": r["token_ids"]} for r in resp]}])
    for a, b in zip(lp["groups"][0]["responses"], resp):
        assert a["logprobs"] == pytest.approx(b["logprobs"], abs=1e-4)
    up = c.update(rollout_job_id=ro.job_id, optimizer={"lr": 1e-3}, expected_policy_version=0)
    assert up["policy_version_after"] == 1 and "loss" in up["metrics"]
    with pytest.raises(GrpodError) as ei:
        c.submit_update(rollout_job_id=ro.job_id, expected_policy_version=0)
    assert (ei.value.status, ei.value.field) == (409, "expected_policy_version")
    ck = c.checkpoint()
    assert ck["policy_version"] == 1 and c.checkpoints()[0]["policy_version"] == 1
    kinds = {j["kind"] for j in c.jobs(status="done", limit=50)}
    assert {"rollout", "update", "checkpoint"} <= kinds
    assert all(j["kind"] == "update" for j in c.jobs(kind="update"))


def test_cancel_raises_job_failed(make_daemon):
    d = make_daemon()
    c = Client(d.url)
    # both long enough to be running (or still queued) when cancelled, on any machine
    a = c.submit_rollouts([{"prompt": "x", "n": 8}], {"max_tokens": 400, "ignore_eos": True})
    b = c.submit_rollouts([{"prompt": "y", "n": 8}], {"max_tokens": 400, "ignore_eos": True})
    assert c.cancel(b)["id"] == b
    c.cancel(a)
    for jid in (a, b):
        with pytest.raises(JobFailed) as ei:
            c.wait(jid, timeout=120)
        assert ei.value.job["status"] == "cancelled" and ei.value.code == "cancelled"


def test_wait_timeout(make_daemon):
    d = make_daemon()
    c = Client(d.url)
    long = c.submit_rollouts([{"prompt": "x", "n": 8}], {"max_tokens": 400, "ignore_eos": True})
    with pytest.raises(GrpodError) as ei:
        c.wait(long, timeout=0.2)
    assert ei.value.code == "timeout"
    c.cancel(long)


def test_retries_429_after_retry_after(make_daemon, monkeypatch):
    d = make_daemon(args=["--max-queued-jobs", "1"])
    c = Client(d.url, max_retries=0)
    # a long rollout runs, an update is held behind it: what comes next queues (1 allowed)
    submits = (lambda: c.submit_rollouts([{"prompt": "x", "n": 8}], {"max_tokens": 300, "ignore_eos": True, "seed": 1}),
               lambda: c.submit_update([{"prompt_ids": [1, 2], "responses": [{"token_ids": [3], "reward": 1.0},
                                                                             {"token_ids": [4], "reward": 0.0}]}]))
    for submit in submits:      # each claimed before the next is sent
        jid = submit()
        end = time.time() + 60
        while c.job(jid)["status"] == "queued" and time.time() < end:
            time.sleep(0.02)
    # fill the queue until it refuses (how many fit depends on how far the engine got: the
    # update may still be queued on a busy machine), so no count is assumed
    accepted = []
    with pytest.raises(GrpodError) as ei:    # without retries the 429 reaches the caller
        for _ in range(6):
            accepted.append(c.submit_rollouts([{"prompt": "y", "n": 1}], {"max_tokens": 1}))
    assert ei.value.status == 429 and ei.value.code == "queue_full"
    slept = []
    real_sleep = time.sleep
    monkeypatch.setattr(grpod_client.time, "sleep", lambda s: (slept.append(s), real_sleep(s)))
    c.max_retries = 1000
    second = c.submit_rollouts([{"prompt": "z", "n": 1}], {"max_tokens": 1})   # waits for room
    assert slept and slept[0] == 1.0, slept     # the server's Retry-After: 1
    for jid in accepted + [second]:
        assert c.wait(jid, timeout=300)["groups"]


def test_iter_jobs_pages_every_job_once(make_daemon):
    d = make_daemon()
    c = Client(d.url)
    ids = [c.submit_rollouts([{"prompt_ids": [5 + i, 6], "n": 1}], {"max_tokens": 1, "seed": i}) for i in range(7)]
    for j in ids:
        c.wait(j, timeout=60)
    page = d.get("/v1/jobs?limit=3").json()
    assert [j["id"] for j in page["jobs"]] == ids[::-1][:3] and page["next"]
    # a job submitted while walking is newer than the first page: the walk neither repeats nor skips
    seen = []
    for k, j in enumerate(c.iter_jobs(page=3)):
        seen.append(j["id"])
        if k == 1:
            c.submit_rollouts([{"prompt_ids": [9, 9], "n": 1}], {"max_tokens": 1})
    assert seen == ids[::-1]
    assert d.get("/v1/jobs?limit=8").json()["next"] is not None      # a full page (8 jobs): there may be more
    assert d.get("/v1/jobs?limit=9").json()["next"] is None
    r = d.get("/v1/jobs?after=x")
    assert r.status_code == 400 and r.json()["error"]["field"] == "after"
    d.stop()
