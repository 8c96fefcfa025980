# test_dashboard.py — /dashboard and its data: a toy run (examples/train_toy.py, 4 letters, 40
# steps) leaves one history row per rollout and per update in the store, which a restarted
# daemon still serves; the page is self-contained (no external URL); in headless Chromium it
# renders every chart, the reward curve rises, and no script error is counted (the page counts
# window errors and console.error on <body data-errors>). The screenshot lands in the test's
# tmp dir (docs/dashboard.png is one of these). Chromium comes from tools/deps.sh; without it
# the browser part is skipped.
import os
import re
import shutil
import subprocess
import sys

import pytest

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "train_toy.py")


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        p = shutil.which(name)
        if p:
            return p
    return None


def browse(url, *args):
    r = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        "--window-size=1400,1100", "--virtual-time-budget=5000", *args, url],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r


def test_dashboard_shows_the_toy_run(make_daemon, tmp_path):
    data = tmp_path / "data"
    d = make_daemon(data)
    r = subprocess.run([sys.executable, EXAMPLE, "--url", d.url, "--out", str(tmp_path / "toy"), "--steps", "40",
                        "--letters", "abcd"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    hist = d.get("/v1/dashboard").json()
    rows = hist["history"]
    assert sum(h["kind"] == "rollout" for h in rows) == 40 and sum(h["kind"] == "update" for h in rows) == 40
    upd = [h for h in rows if h["kind"] == "update"]
    assert [h["policy_version"] for h in upd] == list(range(1, 41))
    for k in ("loss", "kl", "entropy", "clip_frac", "grad_norm", "tokens_packed", "tokens_standard", "tokens_per_s"):
        assert k in upd[0]["stats"], k
    ro = [h for h in rows if h["kind"] == "rollout"]
    assert all("reward_mean" in h["stats"] and "reward_std" in h["stats"] for h in ro)
    first = sum(h["stats"]["reward_mean"] for h in ro[:5]) / 5
    last = sum(h["stats"]["reward_mean"] for h in ro[-5:]) / 5
    assert last > first + 0.1, (first, last)
    assert hist["queue"]["counts"]["update"]["done"] == 40 and hist["model"]["policy_version"] == 40
    assert hist["memory"]["param_bytes"] > 0 and hist["memory"]["kv_rows_capacity"] > 0
    newer = d.get("/v1/dashboard?after=%d" % rows[-2]["id"]).json()["history"]
    assert [h["id"] for h in newer] == [rows[-1]["id"]]
    assert d.get("/v1/dashboard?after=x").status_code == 400

    # the history is in the store: a restarted daemon serves the same rows
    assert d.stop() == 0
    d = make_daemon(data)
    assert d.get("/v1/dashboard").json()["history"] == rows

    page = d.get("/dashboard")
    assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html")
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page.text), "the page must not load anything external"

    if not chromium():
        pytest.skip("no chromium (tools/deps.sh installs it)")
    dom = browse(d.url + "/dashboard", "--dump-dom").stdout
    body = re.search(r"<body[^>]*>", dom).group(0)
    assert 'data-errors="0"' in body and "data-polls" in body, body
    assert dom.count('class="series"') >= 9            # every chart drew its series
    m = re.search(r'<polyline points="([^"]+)"[^>]*data-stat="reward_mean" data-n="(\d+)"', dom)
    assert m and int(m.group(2)) == 40, m
    ys = [float(p.split(",")[1]) for p in m.group(1).split()]
    assert sum(ys[-5:]) / 5 < sum(ys[:5]) / 5 - 5, "the reward curve does not rise (SVG y grows downwards)"
    shot = tmp_path / "dashboard.png"
    r = browse(d.url + "/dashboard", "--screenshot=%s" % shot)
    assert shot.stat().st_size > 10000
    assert "Uncaught" not in r.stderr
    print("screenshot:", shot)
