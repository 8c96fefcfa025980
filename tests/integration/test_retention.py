# test_retention.py — a bounded store (--retain-jobs): finished jobs past the newest N are deleted,
# never a done update whose inputs replay still reads, and the daemon restarts exactly over what
# is left; /metrics reports the store's size; the job counts stay those of the jobs table.
import os
import re
import sqlite3


def lp_job(d, i):
    return d.submit("/v1/rollouts", {"groups": [{"prompt_ids": [5 + i, 6, 7], "n": 1}],
                                     "sampling": {"max_tokens": 2, "seed": 7 + i}})


def update_job(d, i):
    return d.submit("/v1/updates", {"groups": [{"prompt_ids": [11, 12 + i], "responses": [
        {"token_ids": [13, 14], "reward": 1.0}, {"token_ids": [15 + i, 16], "reward": 0.0}]}]})


def test_finished_jobs_past_retention_are_deleted_but_replay_inputs_stay(make_daemon, tmp_path):
    data = tmp_path / "data"
    d = make_daemon(data_dir=data, args=["--retain-jobs", "3"])
    ups = [update_job(d, i) for i in range(2)]
    for j in ups:
        assert d.wait_job(j)["status"] == "done"
    lps = [lp_job(d, i) for i in range(5)]
    for j in lps:
        assert d.wait_job(j)["status"] == "done"
    ck = d.submit("/v1/checkpoints", {})
    assert d.wait_job(ck)["status"] == "done"
    # one checkpoint covers nothing yet (inputs are dropped once two do): both updates stay, and
    # of the rest the newest three finished (the checkpoint and two rollouts)
    for j in ups + lps[-2:] + [ck]:
        assert d.get("/v1/jobs/" + j).status_code == 200, j
    for j in lps[:3]:
        assert d.get("/v1/jobs/" + j).status_code == 404, j
    m = d.get("/metrics").text
    size = re.search(r"^grpod_store_bytes (\d+)$", m, re.M)
    assert size and int(size.group(1)) > 0, m
    kept = {(k, s): int(n) for k, s, n in re.findall(r'^grpod_jobs\{kind="(\w+)",status="(\w+)"\} (\d+)$', m, re.M)}
    v = d.get("/v1/model").json()["policy_version"]
    d.stop()
    db = sqlite3.connect(os.path.join(str(data), "grpod.db"))
    recount = {(k, s): n for k, s, n in db.execute("SELECT kind, status, count(*) FROM jobs GROUP BY kind, status")}
    db.close()
    assert kept == recount, (kept, recount)
    # a restart resumes the checkpoint; the kept jobs are all it needs
    d2 = make_daemon(data_dir=data, args=["--retain-jobs", "3"])
    assert d2.get("/v1/model").json()["policy_version"] == v
    d2.stop()
