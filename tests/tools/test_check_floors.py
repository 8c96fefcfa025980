"""tools/check_floors.sh against a copy of the source tree: the copy as it is passes, and an
include that goes up between the engine's rooms (or from a room to the engine's top) fails it,
naming the file, the line and the rule; an include that goes down stays allowed."""
import os
import shutil
import subprocess

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "tools", "check_floors.sh")
# what the script reads: the floors, the tests (for their includes), tools/ and the Makefile
COPIED = ["common", "kernels", "engine", "api", "store", "daemon", "tests", "tools"]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    dst = tmp_path_factory.mktemp("floors")
    skip = shutil.ignore_patterns("fixtures", "__pycache__", "*.o", "*.a")
    for d in COPIED:
        shutil.copytree(os.path.join(ROOT, d), dst / d, ignore=skip, symlinks=True)
    shutil.copy(os.path.join(ROOT, "Makefile"), dst / "Makefile")
    return dst


def check(root):
    r = subprocess.run(["bash", SCRIPT, str(root)], capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout + r.stderr


def inject(tree, includes):
    """Appends an #include to each file of includes [(path, header)]; returns the line numbers
    and an undo."""
    old, lines = {}, []
    for path, header in includes:
        f = tree / path
        text = f.read_text()
        old.setdefault(f, text)
        f.write_text(text + '#include "%s"\n' % header)
        lines.append(text.count("\n") + 1)

    def undo():
        for f, text in old.items():
            f.write_text(text)

    return lines, undo


def test_the_tree_as_it_is_passes(tree):
    rc, out = check(tree)
    assert rc == 0, out
    assert "no upward include" in out


# (file in a room, a header above it, the room named in the message); one run checks them all,
# each must be reported on its own line
UPWARD = [
    ("engine/format/json.c", "engine/train/state.h", "engine/format"),
    ("engine/model/model.c", "engine/rollout/decode.h", "engine/model"),
    ("engine/backend/backend_cpu.c", "engine/engine.h", "engine/backend"),
    ("engine/text/chat.c", "engine/model/model.h", "engine/text"),
    ("engine/dist/comm.h", "engine/train/state.h", "engine/dist"),
]


def test_an_upward_include_between_rooms_fails(tree):
    lines, undo = inject(tree, [(p, h) for p, h, _ in UPWARD])
    try:
        rc, out = check(tree)
    finally:
        undo()
    assert rc != 0, out
    for (path, header, room), line in zip(UPWARD, lines):
        assert "%s:%d: %s may not include %s" % (path, line, room, header) in out, out


# downward includes the rooms' table allows: they must not fail
DOWNWARD = [
    ("engine/text/chat.c", "engine/format/json.h"),
    ("engine/train/update.c", "engine/dist/comm.h"),
    ("engine/rollout/decode.c", "engine/model/model.h"),
    ("engine/engine.c", "engine/rollout/decode.h"),
]


def test_a_downward_include_passes(tree):
    _, undo = inject(tree, DOWNWARD)
    try:
        rc, out = check(tree)
    finally:
        undo()
    assert rc == 0, out
