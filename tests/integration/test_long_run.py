# test_long_run.py — a daemon over a store that a long run filled: 20,000 finished jobs written
# straight into grpod.db (generated, not run; LONG_RUN_JOBS=100000 for the full size), then a
# start with --retain-jobs: the store is cut to what it keeps, the job counts are those of the
# table, every kept job is listed exactly once page by page, and new work still runs.
import os
import re
import sqlite3
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "clients", "python"))
from grpod_client import Client  # noqa: E402

N_JOBS = int(os.environ.get("LONG_RUN_JOBS", "20000"))
KEEP = 5000


def test_a_store_of_a_long_run_is_cut_and_served(make_daemon, tmp_path):
    data = tmp_path / "data"
    d = make_daemon(data_dir=data, args=["--retain-jobs", "0"])     # creates the schema, keeps all
    d.stop()
    db = sqlite3.connect(os.path.join(str(data), "grpod.db"))
    result = '{"groups":[{"responses":[{"token_ids":[1,2,3],"logprobs":[-0.5,-0.25,-1.0]}]}]}'
    rows = [("j_%016x" % (0x100000 + i), ("rollout", "logprobs", "checkpoint")[i % 3], ("done", "failed", "cancelled")[i % 5 % 3],
             "{}", result, 1000.0 + i, 1000.0 + i, 1000.5 + i) for i in range(N_JOBS)]
    db.executemany("INSERT INTO jobs (id, kind, status, payload, result, created_at, started_at, finished_at) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
    db.commit()
    size_before = db.execute("SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()").fetchone()[0]
    db.close()
    d = make_daemon(data_dir=data, args=["--retain-jobs", str(KEEP)])
    m = d.get("/metrics").text
    counts = {(k, s): int(n) for k, s, n in re.findall(r'^grpod_jobs\{kind="(\w+)",status="(\w+)"\} (\d+)$', m, re.M)}
    assert sum(counts.values()) == KEEP, counts
    # the newest KEEP are the ones kept, and a walk lists each once
    seen = [j["id"] for j in Client(d.url).iter_jobs(page=1000)]
    assert len(seen) == KEEP and len(set(seen)) == KEEP
    assert seen[0] == "j_%016x" % (0x100000 + N_JOBS - 1) and seen[-1] == "j_%016x" % (0x100000 + N_JOBS - KEEP)
    # new work runs beside it, and the counts follow it
    j = d.submit("/v1/rollouts", {"groups": [{"prompt_ids": [5, 6], "n": 1}], "sampling": {"max_tokens": 2}})
    assert d.wait_job(j)["status"] == "done"
    m = d.get("/metrics").text
    assert re.search(r'^grpod_jobs\{kind="rollout",status="done"\} %d$' % (counts.get(("rollout", "done"), 0) + 1), m, re.M), m
    # the deleted jobs' pages go back (a database this version made vacuums incrementally)
    assert int(re.search(r"^grpod_store_bytes (\d+)$", m, re.M).group(1)) < size_before * (KEEP + 1000) // N_JOBS
    d.stop()
    db = sqlite3.connect(os.path.join(str(data), "grpod.db"))
    recount = {(k, s): n for k, s, n in db.execute("SELECT kind, status, count(*) FROM jobs GROUP BY kind, status")}
    kept = {(k, s): n for k, s, n in db.execute("SELECT kind, status, n FROM job_counts WHERE n > 0")}
    db.close()
    assert recount == kept
