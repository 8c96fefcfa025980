#!/usr/bin/env python3
"""slow_clients.py — the slowloris measurement: N clients each send one byte of a request
head every INTERVAL seconds (and reconnect at once when the daemon closes them, unless
--no-reconnect), while a probe
GETs /healthz every 0.5 s. Prints the probes' success and latency, and the daemon's RSS.

  python3 tests/bench/slow_clients.py --port 8780 --pid PID [--clients 3000] [--interval 3] [--seconds 60]

The daemon must keep answering /healthz under them (docs/benchmarks.md, "Hostile inputs")."""
import argparse
import resource
import selectors
import socket
import threading
import time
import urllib.request

HEAD = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 4000


def rss_mib(pid):
    try:
        for line in open("/proc/%d/status" % pid):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--pid", type=int, default=0)
    ap.add_argument("--clients", type=int, default=3000)
    ap.add_argument("--interval", type=float, default=3.0)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--no-reconnect", action="store_true", help="closed clients stay closed")
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, a.clients + 256), hard))

    probes, stop = [], threading.Event()

    def probe():
        while not stop.is_set():
            t = time.time()
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/healthz" % a.port, timeout=5) as r:
                    ok = r.status == 200
            except Exception:
                ok = False
            probes.append((ok, time.time() - t))
            time.sleep(0.5)

    sel = selectors.DefaultSelector()
    conns = {}                       # socket -> bytes sent
    stats = {"opened": 0, "closed_by_daemon": 0, "connect_failed": 0}

    def open_one():
        s = socket.socket()
        s.settimeout(5)
        try:
            s.connect(("127.0.0.1", a.port))
        except OSError:
            stats["connect_failed"] += 1
            s.close()
            return
        s.setblocking(False)
        conns[s] = 0
        sel.register(s, selectors.EVENT_READ)
        stats["opened"] += 1

    t0 = time.time()
    for _ in range(a.clients):
        open_one()
    ramp, initial = time.time() - t0, stats["opened"]
    th = threading.Thread(target=probe, daemon=True)
    th.start()
    next_drip, peak = time.time(), 0
    while time.time() - t0 < a.seconds:
        for key, _ in sel.select(timeout=0.2):
            s = key.fileobj
            try:
                data = s.recv(65536)
            except OSError:
                data = b""
            if not data:                 # closed by the daemon: reconnect at once, as an attacker would
                sel.unregister(s)
                del conns[s]
                s.close()
                stats["closed_by_daemon"] += 1
                if not a.no_reconnect:
                    open_one()
        if time.time() >= next_drip:
            for s in list(conns):
                i = conns[s]
                try:
                    s.send(HEAD[i % len(HEAD):i % len(HEAD) + 1])
                    conns[s] = i + 1
                except OSError:
                    pass
            next_drip += a.interval
        if a.pid:
            peak = max(peak, rss_mib(a.pid))
    stop.set()
    th.join(10)
    for s in list(conns):
        s.close()
    lat = sorted(t for ok, t in probes if ok)
    n_ok = len(lat)
    pct = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1000 if lat else float("nan")
    print("slow clients: %d (one byte every %.1f s%s), %.0f s; the first %d "
          "opened in %.1f s; the daemon closed %d connections; connect failures %d" %
          (a.clients, a.interval, "" if a.no_reconnect else ", each reconnecting at once when closed", a.seconds, initial, ramp, stats["closed_by_daemon"], stats["connect_failed"]))
    print("healthz probes: %d/%d answered 200; latency p50 %.1f ms, p99 %.1f ms, max %.1f ms" %
          (n_ok, len(probes), pct(0.5), pct(0.99), lat[-1] * 1000 if lat else float("nan")))
    if a.pid:
        print("daemon peak RSS during the run: %.0f MiB" % peak)


if __name__ == "__main__":
    main()
