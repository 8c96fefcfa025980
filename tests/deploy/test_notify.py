# test_notify.py — grpod's sd_notify conversation with a real daemon process, the test playing
# systemd: it binds the Unix datagram socket that NOTIFY_SOCKET names, starts `./grpod serve`
# (CPU backend, zero-config tiny model, temp data dir, free loopback port) and checks:
#   - READY=1 arrives only once the model is loaded: /readyz answers 200 right when it arrives;
#   - STATUS= lines (policy version, queue depth);
#   - WATCHDOG=1 every ~WATCHDOG_USEC/2 (400 ms interval here), never later than the interval;
#   - RELOADING=1 then READY=1 around SIGHUP, with the config file re-read;
#   - STOPPING=1 on SIGTERM, then exit status 0;
#   - with GRPOD_TEST_HANG_ENGINE_AFTER_MS=N (a test hook, only in build/grpod-test-hooks: the
#     engine thread sleeps forever N ms after it starts) the pings stop within ~2 intervals of the hang, so systemd would restart;
#   - a non-loopback --listen without --api-key-file is refused at start, naming the fix;
#   - the example config deploy/grpod.conf, every key uncommented, starts a working daemon.
# Skipped only while `./grpod serve --help` does not exist (the daemon not landed yet).
import os
import re
import signal
import socket
import subprocess
import tempfile
import threading
import time

import pytest
import requests

from deploy_util import GRPOD, GRPOD_TEST_HOOKS, ROOT

WATCHDOG_USEC = 400_000
INTERVAL = WATCHDOG_USEC / 1e6


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class FakeSystemd:
    """Listens on NOTIFY_SOCKET; records (monotonic time, line) for every line of every datagram.
    When READY=1 arrives it asks /readyz at once and records the status code."""

    def __init__(self, dirpath, port):
        self.path = os.path.join(dirpath, "notify.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.1)
        self.port = port
        self.msgs = []           # [(t, "KEY=value")]
        self.readyz_at_ready = []  # status codes of /readyz asked as each READY=1 arrived
        self.stop = False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop:
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                return
            t = time.monotonic()
            lines = data.decode("utf-8", "replace").split("\n")
            for line in lines:
                if line:
                    self.msgs.append((t, line))
            if "READY=1" in lines:
                try:
                    r = requests.get("http://127.0.0.1:%d/readyz" % self.port, timeout=5)
                    self.readyz_at_ready.append(r.status_code)
                except requests.RequestException as e:
                    self.readyz_at_ready.append(repr(e))

    def times(self, line):
        return [t for t, m in self.msgs if m == line]

    def wait_for(self, line, timeout):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if any(m == line for _, m in self.msgs):
                return True
            time.sleep(0.02)
        return False

    def close(self):
        self.stop = True
        self.thread.join(2)
        self.sock.close()


class Daemon:
    def __init__(self, help_text, extra_env=None, extra_args=(), binary=GRPOD):
        # A short directory: sun_path holds at most 107 bytes.
        self.dir = tempfile.mkdtemp(prefix="grpod-nt-", dir="/tmp")
        self.port = free_port()
        self.systemd = FakeSystemd(self.dir, self.port)
        env = {k: v for k, v in os.environ.items()
               if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS")}
        env.update(NOTIFY_SOCKET=self.systemd.path, WATCHDOG_USEC=str(WATCHDOG_USEC))
        env.update(extra_env or {})
        self.errlog = open(os.path.join(self.dir, "stderr.log"), "w+")
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [binary, "serve", "--data-dir", os.path.join(self.dir, "data"),
             "--listen", "127.0.0.1:%d" % self.port, *extra_args],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.errlog)

    def stderr(self):
        self.errlog.flush()
        self.errlog.seek(0)
        return self.errlog.read()[-20000:]

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.systemd.close()
        self.errlog.close()
        subprocess.run(["rm", "-rf", self.dir])


@pytest.fixture
def daemon_factory(help_text):
    made = []

    def make(**kw):
        d = Daemon(help_text, **kw)
        made.append(d)
        return d
    yield make
    for d in made:
        d.close()


def test_ready_status_watchdog_reload_stopping(daemon_factory, tmp_path):
    conf = tmp_path / "grpod.conf"
    conf.write_text("# reloadable settings\nlog-level = info\nmax-n = 64\n")
    d = daemon_factory(extra_args=("--config", str(conf)))
    sd = d.systemd
    assert sd.wait_for("READY=1", 30), "no READY=1 within 30 s; stderr:\n" + d.stderr()
    t_ready = sd.times("READY=1")[0]
    # READY means usable: /readyz, asked the moment READY arrived, already says 200.
    end = time.monotonic() + 10
    while not sd.readyz_at_ready and time.monotonic() < end:
        time.sleep(0.01)
    assert sd.readyz_at_ready[0] == 200, sd.readyz_at_ready
    # Let the watchdog run for ~5 intervals.
    time.sleep(5 * INTERVAL + 0.2)
    assert d.proc.poll() is None, "daemon died: " + d.stderr()
    pings = [t for t in sd.times("WATCHDOG=1") if t >= t_ready]
    assert len(pings) >= 4, "only %d WATCHDOG=1 in %.1f s" % (len(pings), 5 * INTERVAL)
    gaps = sorted(b - a for a, b in zip(pings, pings[1:]))
    median = gaps[len(gaps) // 2]
    # Pinged at half the interval: median ~0.2 s. The hard contract is "within the interval"
    # (systemd kills at 0.4 s); 1.5x of it leaves room for a loaded 2-core test machine.
    assert 0.3 * INTERVAL <= median <= 0.75 * INTERVAL, "median gap %.3f s, gaps %s" % (median, gaps)
    assert gaps[-1] < 1.5 * INTERVAL, "max gap %.3f s" % gaps[-1]
    # STATUS= lines say the policy version and the queue depth.
    status = [m for _, m in sd.msgs if m.startswith("STATUS=")]
    assert status, "no STATUS= line; got %s" % [m for _, m in sd.msgs][:20]
    assert any("policy" in s.lower() and "queue" in s.lower() for s in status), status
    # ... and once READY, the current STATUS no longer says the model is loading.
    after = [m for t, m in sd.msgs if m.startswith("STATUS=") and t >= t_ready]
    current = after[-1] if after else status[-1]
    assert "loading" not in current, "STATUS still says loading after READY=1: %s" % status
    # SIGHUP: RELOADING=1, the config file re-read, READY=1 again.
    conf.write_text("# reloadable settings\nlog-level = debug\nmax-n = 8\n")
    d.proc.send_signal(signal.SIGHUP)
    end = time.monotonic() + 10
    while len(sd.times("READY=1")) < 2 and time.monotonic() < end:
        time.sleep(0.02)
    reloading, readies = sd.times("RELOADING=1"), sd.times("READY=1")
    assert len(reloading) == 1 and len(readies) == 2, [m for _, m in sd.msgs if "WATCHDOG" not in m]
    assert readies[0] < reloading[0] <= readies[1]
    assert '"event":"reloaded"' in d.stderr() and '"log_level":"debug","max_n":8' in d.stderr(), d.stderr()
    assert requests.get("http://127.0.0.1:%d/readyz" % d.port, timeout=5).status_code == 200
    # SIGTERM: STOPPING=1, then exit 0.
    d.proc.send_signal(signal.SIGTERM)
    assert sd.wait_for("STOPPING=1", 15), "no STOPPING=1 after SIGTERM; stderr:\n" + d.stderr()
    rc = d.proc.wait(30)
    assert rc == 0, "exit %d after SIGTERM; stderr:\n%s" % (rc, d.stderr())
    assert sd.times("STOPPING=1")[0] > readies[1]


def test_watchdog_stops_when_engine_hangs(daemon_factory):
    hang_ms = 1500
    assert os.access(GRPOD_TEST_HOOKS, os.X_OK), "make test builds " + GRPOD_TEST_HOOKS
    d = daemon_factory(extra_env={"GRPOD_TEST_HANG_ENGINE_AFTER_MS": str(hang_ms)}, binary=GRPOD_TEST_HOOKS)
    sd = d.systemd
    assert sd.wait_for("READY=1", 30), "no READY=1; stderr:\n" + d.stderr()
    t_ready = sd.times("READY=1")[0]
    if t_ready - d.t0 > hang_ms / 1e3:
        pytest.fail("READY took %.1f s, longer than the hang delay; raise hang_ms" % (t_ready - d.t0))
    # The engine thread starts after the process (t0) and before READY, and hangs hang_ms after
    # it starts: so the hang is somewhere in [t0 + hang_ms, t_ready + hang_ms].
    hang_lo, hang_hi = d.t0 + hang_ms / 1e3, t_ready + hang_ms / 1e3
    end = hang_hi + 6 * INTERVAL
    while time.monotonic() < end:
        time.sleep(0.05)
    pings = sd.times("WATCHDOG=1")
    assert pings, "no WATCHDOG=1 at all; stderr:\n" + d.stderr()
    last = pings[-1]
    # Pings went on while the engine was alive ...
    assert last >= hang_lo - 1.5 * INTERVAL, "pings stopped %.2f s before the hang" % (hang_lo - last)
    # ... and stopped within ~2 intervals of the hang (the detector needs one tick to see a stale
    # heartbeat; the second interval is slack for a loaded machine).
    assert last <= hang_hi + 2 * INTERVAL + 0.2, \
        "pinged %.2f s after the engine hung (%d pings after)" % (last - hang_hi, sum(t > hang_hi for t in pings))
    # Not dead, just not vouching for itself: HTTP still answers (systemd restarts it, not us),
    # and the log says why the pings stopped.
    assert d.proc.poll() is None, "daemon exited instead of going quiet: " + d.stderr()
    assert requests.get("http://127.0.0.1:%d/healthz" % d.port, timeout=5).status_code == 200
    err = d.stderr()
    assert '"event":"engine_test_hang"' in err and '"event":"watchdog_skipped"' in err, err


def test_non_loopback_without_key_refused(help_text):
    with tempfile.TemporaryDirectory(prefix="grpod-nt-") as tmp:
        port = free_port()
        r = subprocess.run([GRPOD, "serve", "--data-dir", os.path.join(tmp, "data"),
                            "--listen", "0.0.0.0:%d" % port],
                           capture_output=True, text=True, timeout=30, cwd=ROOT,
                           env={k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"})
        assert r.returncode != 0
        assert "--api-key-file" in r.stderr, r.stderr
        assert "--insecure-no-auth" in r.stderr, "the message should name the override too: " + r.stderr
        # Nothing was listening on the port meanwhile (refused before binding).
        s = socket.socket()
        try:
            assert s.connect_ex(("127.0.0.1", port)) != 0
        finally:
            s.close()


def test_non_loopback_with_insecure_flag_starts(help_text):
    with tempfile.TemporaryDirectory(prefix="grpod-nt-") as tmp:
        port = free_port()
        p = subprocess.Popen([GRPOD, "serve", "--data-dir", os.path.join(tmp, "data"),
                              "--listen", "0.0.0.0:%d" % port, "--insecure-no-auth"],
                             cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             env={k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"})
        try:
            ok, end = False, time.monotonic() + 30
            while time.monotonic() < end and p.poll() is None:
                try:
                    ok = requests.get("http://127.0.0.1:%d/healthz" % port, timeout=2).status_code == 200
                except requests.RequestException:
                    pass
                if ok:
                    break
                time.sleep(0.1)
            assert ok, "not serving with --insecure-no-auth (rc %s)" % p.poll()
            p.send_signal(signal.SIGTERM)
            assert p.wait(30) == 0
        finally:
            if p.poll() is None:
                p.kill()
                p.wait(10)
            err = p.stderr.read()
            p.stderr.close()
        assert "insecure" in err.lower(), "a warning should be logged: " + err[-2000:]


def test_example_config_every_key_starts(help_text, tmp_path):
    """deploy/grpod.conf with every documented key uncommented (paths pointed at temp files) is
    accepted: the values it shows are valid, and the daemon comes up ready with them."""
    port = free_port()
    key = tmp_path / "api_key"
    key.write_text("test-key-0123456789\n")
    subst = {"model": None, "data-dir": str(tmp_path / "data"), "api-key-file": str(key),
             "listen": "127.0.0.1:%d" % port}
    out, seen = [], set()
    for line in open(os.path.join(ROOT, "deploy", "grpod.conf")):
        m = re.match(r"^#?\s*([a-z][a-z0-9-]*)\s*=\s*(.*)$", line.strip())
        if not m:
            continue
        k, v = m.groups()
        seen.add(k)
        if k in subst:
            if subst[k] is None:
                continue
            v = subst[k]
        out.append("%s = %s" % (k, v))
    assert len(seen) >= 10, seen
    conf = tmp_path / "all.conf"
    conf.write_text("\n".join(out) + "\n")
    p = subprocess.Popen([GRPOD, "serve", "--config", str(conf)], cwd=str(tmp_path),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         env={k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"})
    try:
        ok, end = False, time.monotonic() + 30
        while time.monotonic() < end and p.poll() is None and not ok:
            try:
                ok = requests.get("http://127.0.0.1:%d/readyz" % port, timeout=2).status_code == 200
            except requests.RequestException:
                time.sleep(0.1)
        assert ok, "not ready with %s (rc %s)" % (conf.read_text(), p.poll())
        # The key from the file is enforced on /v1; health stays open.
        base = "http://127.0.0.1:%d" % port
        assert requests.get(base + "/v1/model", timeout=5).status_code == 401
        assert requests.get(base + "/v1/model", timeout=5,
                            headers={"Authorization": "Bearer test-key-0123456789"}).status_code == 200
        assert requests.get(base + "/healthz", timeout=5).status_code == 200
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
        err = p.stderr.read()
        p.stderr.close()
    assert '"event":"starting"' in err, err[-2000:]
