# test_batching.py — continuous batching in the daemon (CPU backend, tiny model): rollouts
# posted back to back run together (overlapping job times, fewer scheduler steps than run one
# after the other) and give the same tokens as run alone; an update queued between rollouts
# runs alone and each rollout reports the policy version it ran under; the KV budget turns a
# group that can never fit into a 413 and makes groups wait for rows; cancelling a running
# rollout frees its rows.
import re
import time


def metric(d, name):
    m = re.search(r"^%s (\S+)$" % re.escape(name), d.get("/metrics").text, re.M)
    assert m, name
    return float(m.group(1))


JOB_A = {"groups": [{"prompt": "x", "n": 8}],
         "sampling": {"max_tokens": 200, "ignore_eos": True, "seed": 1}}
JOB_B = {"groups": [{"prompt": "hello", "n": 4}, {"prompt": "abc", "n": 2}],
         "sampling": {"max_tokens": 150, "ignore_eos": True, "seed": 2, "temperature": 0.7, "top_p": 0.9}}


def same_results(x, y):
    assert len(x["groups"]) == len(y["groups"])
    for g, h in zip(x["groups"], y["groups"]):
        assert g["prompt_ids"] == h["prompt_ids"]
        for r, s in zip(g["responses"], h["responses"]):
            assert r["token_ids"] == s["token_ids"]
            assert r["finish_reason"] == s["finish_reason"] and r["text"] == s["text"]
            assert max(abs(a - b) for a, b in zip(r["logprobs"], s["logprobs"])) < 1e-4


def test_back_to_back_rollouts_overlap_and_match_alone(make_daemon):
    d = make_daemon()
    steps0 = metric(d, "grpod_rollout_steps_total")
    a = d.submit("/v1/rollouts", JOB_A)
    b = d.submit("/v1/rollouts", JOB_B)
    ja, jb = d.wait_job(a), d.wait_job(b)
    assert ja["status"] == "done" and jb["status"] == "done", (ja, jb)
    # the second started before the first finished, and they shared decode steps
    assert jb["started_at"] < ja["finished_at"], (jb["started_at"], ja["finished_at"])
    together = metric(d, "grpod_rollout_steps_total") - steps0
    assert together < 200 + 150 - 50, together
    # one at a time, same seeds: the same tokens
    sa = d.wait_job(d.submit("/v1/rollouts", JOB_A))
    steps1 = metric(d, "grpod_rollout_steps_total")
    sb = d.wait_job(d.submit("/v1/rollouts", JOB_B))
    assert sb["started_at"] >= sa["finished_at"]
    # alone, a job takes max_tokens - 1 steps (its first step prefills and decodes)
    assert metric(d, "grpod_rollout_steps_total") - steps1 == 149
    same_results(ja["result"], sa["result"])
    same_results(jb["result"], sb["result"])
    assert metric(d, "grpod_kv_rows_used") == 0 and metric(d, "grpod_rollout_running_responses") == 0
    assert d.stop() == 0


def test_update_between_rollouts_sees_the_right_versions(make_daemon):
    d = make_daemon()
    v0 = d.get("/v1/model").json()["policy_version"]
    r1 = d.submit("/v1/rollouts", JOB_A)
    upd = {"groups": [{"prompt_ids": [1, 2, 3], "responses": [{"token_ids": [4, 5], "reward": 1.0},
                                                              {"token_ids": [6, 7], "reward": 0.0}]}],
           "optimizer": {"lr": 1e-2}, "algorithm": {"kl_coef": 0.0}}
    u = d.submit("/v1/updates", upd)
    r2 = d.submit("/v1/rollouts", JOB_B)
    j1, ju, j2 = d.wait_job(r1), d.wait_job(u), d.wait_job(r2)
    assert j1["status"] == ju["status"] == j2["status"] == "done", (j1, ju, j2)
    assert j1["result"]["policy_version"] == v0 and j1["policy_version"] == v0
    assert ju["result"]["policy_version_before"] == v0 and ju["result"]["policy_version_after"] == v0 + 1
    assert j2["result"]["policy_version"] == v0 + 1 and j2["policy_version"] == v0 + 1
    # the update ran alone after the first rollout; the second rollout only after the update
    assert ju["finished_at"] >= j1["finished_at"]
    assert j2["started_at"] >= ju["finished_at"]
    assert d.stop() == 0


def test_kv_budget_rejects_and_queues(make_daemon):
    d = make_daemon(args=["--kv-budget-mib", "1"])       # 512 rows of 2 KiB on the tiny model
    cap = metric(d, "grpod_kv_rows_capacity")
    assert cap == 1024 * 1024 / metric(d, "grpod_kv_row_bytes") == 512
    r = d.post("/v1/rollouts", {"groups": [{"prompt": "ab", "n": 1}, {"prompt": "abc", "n": 8}],
                                "sampling": {"max_tokens": 64}})
    assert r.status_code == 413, r.text
    err = r.json()["error"]
    assert err["field"] == "groups[1]" and "KV" in err["message"] and "512" in err["message"], err
    # two jobs of ~300 rows each: the second waits for the first's rows, then runs
    body = lambda seed: {"groups": [{"prompt": "hello", "n": 3}],
                         "sampling": {"max_tokens": 100, "ignore_eos": True, "seed": seed}}
    ids = [d.submit("/v1/rollouts", body(s)) for s in (3, 4)]
    waited = 0
    end = time.time() + 60
    while time.time() < end and d.get("/v1/jobs/" + ids[1]).json()["status"] in ("queued", "running"):
        waited = max(waited, metric(d, "grpod_rollout_waiting_groups"))
        assert metric(d, "grpod_kv_rows_used") <= 512
    jobs = [d.wait_job(i) for i in ids]
    assert all(j["status"] == "done" for j in jobs), jobs
    alone = d.wait_job(d.submit("/v1/rollouts", body(4)))
    same_results(jobs[1]["result"], alone["result"])
    print("waiting groups seen:", waited)
    assert d.stop() == 0


def test_cancel_running_rollout_frees_rows(make_daemon):
    d = make_daemon()
    long = d.submit("/v1/rollouts", {"groups": [{"prompt": "x", "n": 16}],
                                     "sampling": {"max_tokens": 4000, "ignore_eos": True, "seed": 1}})
    end = time.time() + 30
    while metric(d, "grpod_kv_rows_used") == 0 and time.time() < end:
        time.sleep(0.01)
    assert d.get("/v1/jobs/" + long).json()["status"] == "running"
    assert metric(d, "grpod_kv_rows_used") == 1 + 16 * 4000
    r = d.delete("/v1/jobs/" + long)
    assert r.status_code == 202, r.text
    assert d.wait_job(long)["status"] == "cancelled"
    assert metric(d, "grpod_kv_rows_used") == 0 and metric(d, "grpod_rollout_jobs_running") == 0
    j = d.wait_job(d.submit("/v1/rollouts", {"groups": [{"prompt": "y", "n": 2}], "sampling": {"max_tokens": 8}}))
    assert j["status"] == "done"
    assert d.stop() == 0
