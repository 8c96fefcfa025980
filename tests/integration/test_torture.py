# test_torture.py — tests/integration/torture.py at CI scale: a seeded stream of rollouts,
# updates and checkpoints under ~20 kill -9s (bounded time), compared with the same stream run
# without kills: same policy_version, same job states, bit-equal probe logprobs. Two of the
# kills land at exact points of a checkpoint job (after its rename, before the store indexes
# it; after that, before its done-write) through build/grpod-test-hooks. Longer on
# request: GRPOD_TORTURE_KILLS=200 GRPOD_TORTURE_ROUNDS=60 GRPOD_TORTURE_BUDGET_S=3600.
# The FIGURES line goes to build/test-logs/torture-figures.json.
import json
import os
import subprocess
import sys

from conftest import GRPOD, ROOT


HOOKS = os.path.join(ROOT, "build", "grpod-test-hooks")


def test_torture_kill9_exactly_once(grpod_available, tmp_path):
    hooks = ["--grpod-hooks", HOOKS] if os.path.exists(HOOKS) else []
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "integration", "torture.py"), "--grpod", GRPOD,
                        "--keep", str(tmp_path / "work")] + hooks, capture_output=True, text=True, timeout=1800, cwd=ROOT)
    figures = [line[len("FIGURES "):] for line in r.stdout.splitlines() if line.startswith("FIGURES ")]
    if figures:
        os.makedirs(os.path.join(ROOT, "build", "test-logs"), exist_ok=True)
        with open(os.path.join(ROOT, "build", "test-logs", "torture-figures.json"), "w") as f:
            f.write(figures[-1] + "\n")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    fig = json.loads(figures[-1])
    assert fig["lost"] == 0 and fig["applied_twice"] == 0 and fig["probe_logprobs_bit_equal"]
    assert fig["kills"] >= 5, fig     # the time budget ran out before a meaningful number of kills
    if hooks:                         # both kill points hit, and the job found its own checkpoint
        assert fig["hooked_kills"] >= 2 and fig["checkpoints_kept"] >= 1, fig


def test_torture_kill9_exactly_once_two_ranks(grpod_available, tmp_path):
    """The same with `--ranks 2` in both runs (updates and replay run on every rank), small scale."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "integration", "torture.py"), "--grpod", GRPOD,
                        "--ranks", "2", "--kills", "5", "--rounds", "4", "--budget-s", "60", "--keep", str(tmp_path / "work")],
                       capture_output=True, text=True, timeout=1800, cwd=ROOT)
    figures = [line[len("FIGURES "):] for line in r.stdout.splitlines() if line.startswith("FIGURES ")]
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    fig = json.loads(figures[-1])
    assert fig["ranks"] == 2 and fig["lost"] == 0 and fig["applied_twice"] == 0 and fig["probe_logprobs_bit_equal"]
    assert fig["kills"] >= 3, fig
