"""store_probes.py — health checks and scrapes of a daemon whose store a long run filled.

For each store size (0, 10K, 100K finished jobs written straight into grpod.db, kept with
--retain-jobs 0), a daemon on the embedded model (cpu backend) serves a training stream (a
rollout then an update on it, over and over) while CLIENTS threads poll /healthz and /metrics
as fast as they get answers; one low-rate probe measures /healthz and /metrics latency every
50 ms from a process of its own (the pollers and the stream run in others, so the probe does
not wait on their interpreter's lock). Prints p50/p99 of each, the pollers' rate and the
stream's steps/min. A benchmark, not a test: no asserts.

Usage: python3 tests/bench/store_probes.py [./grpod] [--sizes 0,10000,100000] [--clients 200] [--procs 8] [--seconds 20]
"""
import argparse, multiprocessing as mp, os, sqlite3, statistics, subprocess, sys, tempfile, threading, time
import urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("grpod", nargs="?", default="./grpod")
ap.add_argument("--sizes", default="0,10000,100000")
ap.add_argument("--clients", type=int, default=200)
ap.add_argument("--seconds", type=float, default=20)
ap.add_argument("--procs", type=int, default=8, help="processes the polling clients are spread over")
ap.add_argument("--port", type=int, default=18870)
args = ap.parse_args()
BASE = "http://127.0.0.1:%d" % args.port


def get(path, timeout=30):
    with urllib.request.urlopen(BASE + path, timeout=timeout) as r:
        return r.status, r.read()


def post(path, body):
    import json
    req = urllib.request.Request(BASE + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def wait_job(jid):
    import json
    while True:
        _, b = get("/v1/jobs/%s?wait=30" % jid, timeout=60)
        j = json.loads(b)
        if j["status"] not in ("queued", "running"):
            return j


def start(data):
    p = subprocess.Popen([args.grpod, "serve", "--data-dir", data, "--listen", "127.0.0.1:%d" % args.port,
                          "--backend", "cpu", "--retain-jobs", "0", "--max-queued-jobs", "0"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            if get("/readyz")[0] == 200:
                return p
        except Exception:
            time.sleep(0.1)
    raise SystemExit("daemon not ready")


def fill(data, n):
    db = sqlite3.connect(os.path.join(data, "grpod.db"))
    result = '{"groups":[{"responses":[{"token_ids":[1,2,3],"logprobs":[-0.5,-0.25,-1.0]}]}]}'
    db.executemany("INSERT INTO jobs (id, kind, status, payload, result, created_at, started_at, finished_at) "
                   "VALUES (?, ?, 'done', '{}', ?, ?, ?, ?)",
                   (("j_%016x" % (0x1000000 + i), ("rollout", "logprobs")[i % 2], result, 1e3 + i, 1e3 + i, 1e3 + i)
                    for i in range(n)))
    db.commit()
    db.close()


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1e3 if xs else float("nan")


def trainer(stop, steps):
    """The training stream, in a process of its own: a rollout then an update on it, over and over."""
    i = 0
    while not stop.is_set():
        r = post("/v1/rollouts", {"groups": [{"prompt_ids": [5 + i % 50, 6, 7], "n": 4}], "sampling": {"max_tokens": 8, "seed": i}})
        wait_job(r["job_id"])
        u = post("/v1/updates", {"rollout_job_id": r["job_id"]})
        wait_job(u["job_id"])
        with steps.get_lock():
            steps.value += 1
        i += 1


def pollers(stop, first, count, served):
    """count polling clients as threads of one process: half /healthz, half /metrics, back to back."""
    def poll(k):
        while not stop.is_set():
            try:
                get("/healthz" if k % 2 else "/metrics")
                with served.get_lock():
                    served.value += 1
            except Exception:
                time.sleep(0.01)
    ths = [threading.Thread(target=poll, args=(first + k,), daemon=True) for k in range(count)]
    for t in ths:
        t.start()
    stop.wait()


def one(n):
    data = tempfile.mkdtemp(prefix="grpod-probes-")
    p = start(data)
    p.terminate(); p.wait(60)
    fill(data, n)
    p = start(data)
    stop = mp.Event()
    steps, served = mp.Value("l", 0), mp.Value("l", 0)
    # The pollers and the stream run in other processes, so that the probe below measures the
    # daemon, not this interpreter's lock shared with 200 threads.
    per = max(1, args.clients // args.procs)
    procs = [mp.Process(target=trainer, args=(stop, steps), daemon=True)]
    procs += [mp.Process(target=pollers, args=(stop, k, min(per, args.clients - k), served), daemon=True)
              for k in range(0, args.clients, per)]
    for q in procs:
        q.start()
    time.sleep(1)
    hz, mt = [], []
    t_end = time.time() + args.seconds
    while time.time() < t_end:
        t = time.perf_counter(); get("/healthz"); hz.append(time.perf_counter() - t)
        t = time.perf_counter(); get("/metrics"); mt.append(time.perf_counter() - t)
        time.sleep(0.05)
    stop.set()
    for q in procs:
        q.join(5)
        if q.is_alive():
            q.terminate()
    p.terminate()
    p.wait(60)
    print("%7d jobs: healthz p50 %6.1f ms p99 %6.1f ms | metrics p50 %6.1f ms p99 %6.1f ms | %d probes | "
          "%.0f polls/s | %.0f steps/min"
          % (n, pct(hz, .5), pct(hz, .99), pct(mt, .5), pct(mt, .99), len(hz), served.value / (args.seconds + 1),
             steps.value * 60 / (args.seconds + 1)), flush=True)


print("store_probes: %d polling clients in %d processes, %.0f s each, cpu backend, %d cores"
      % (args.clients, args.procs, args.seconds, os.cpu_count()))
for n in [int(x) for x in args.sizes.split(",")]:
    one(n)
