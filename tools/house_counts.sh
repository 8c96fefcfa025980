#!/bin/bash
# house_counts.sh — the measures of docs/contributing.md's before-and-after table, re-runnable:
# files per folder, the largest functions, the branches on where the training state lives outside
# the state and dist/, and the places an existing route, request field and op reach (what adding
# one like it touches). Reads the working tree; prints one section per measure. Needs git and
# Universal Ctags (for the function lengths; that section says so when ctags is missing).
set -u
cd "$(dirname "$0")/.."
floors="common kernels engine api store daemon"

echo "## files per folder"
for d in $floors; do
  printf '%-18s %3d\n' "$d/" "$(git ls-files "$d" | wc -l)"
done
printf '%-18s %3d\n' "engine/ (top)" "$(git ls-files engine | grep -vc '^engine/.*/')"
for r in $(git ls-files engine | sed -n 's|^engine/\([^/]*\)/.*|\1|p' | sort -u); do
  printf '%-18s %3d\n' "engine/$r/" "$(git ls-files "engine/$r" | wc -l)"
done

echo "## the largest functions (lines, first to closing brace)"
if ctags --version 2>/dev/null | grep -q Universal; then
  # a CUDA kernel declared with __launch_bounds__ reads to ctags as a function of that name; it
  # is printed as its file and line
  ctags --fields=+ne --kinds-C=f --kinds-C++=f -R -f - --langmap=C++:+.cu.cuh $floors 2>/dev/null |
    awk -F'\t' '{ ln = ""; en = ""
      for (i = 4; i <= NF; i++) { if ($i ~ /^line:/) ln = substr($i, 6); if ($i ~ /^end:/) en = substr($i, 5) }
      name = $1; if (name == "__launch_bounds__") name = "(kernel at line " ln ")"
      if (ln != "" && en != "") print en - ln + 1, $2, name }' | sort -rn >/tmp/house_counts.$$
  echo "all floors:"; head -8 /tmp/house_counts.$$ | awk '{ printf "  %4d  %s  %s\n", $1, $2, substr($0, index($0, $3)) }'
  echo "outside kernels/:"; grep -v ' kernels/' /tmp/house_counts.$$ | head -8 |
    awk '{ printf "  %4d  %s  %s\n", $1, $2, substr($0, index($0, $3)) }'
  echo "functions over 120 lines: $(awk '$1 > 120' /tmp/house_counts.$$ | wc -l)" \
    "(outside kernels/: $(grep -v ' kernels/' /tmp/house_counts.$$ | awk '$1 > 120' | wc -l))"
  rm -f /tmp/house_counts.$$
else
  echo "  (skipped: Universal Ctags not found)"
fi

echo "## include cycles between modules (x.c, x.h, x.cu, x.cuh and x_internal.h are one module)"
python3 - $floors <<'PY'
import os, re, subprocess, sys
files = [f for f in subprocess.run(["git", "ls-files"] + sys.argv[1:], capture_output=True, text=True).stdout.split()
         if re.search(r"\.(c|h|cu|cuh)$", f)]
inc = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
def mod(p): return re.sub(r"_internal$", "", re.sub(r"\.(c|h|cu|cuh)$", "", p))
g = {}
for f in files:
    for h in inc.findall(open(f, errors="replace").read()):
        w = mod(h if "/" in h else os.path.join(os.path.dirname(f), h))
        g.setdefault(mod(f), set()).add(w)
for v in list(g): g[v] = {w for w in g[v] if w in g and w != v}
idx, low, st, on, cycles = {}, {}, [], set(), []
def visit(v):  # Tarjan's strongly connected components, iteratively
    work = [(v, iter(sorted(g[v])))]
    idx[v] = low[v] = len(idx); st.append(v); on.add(v)
    while work:
        u, it = work[-1]
        w = next(it, None)
        if w is None:
            work.pop()
            if work: low[work[-1][0]] = min(low[work[-1][0]], low[u])
            if low[u] == idx[u]:
                c = []
                while not c or c[-1] != u: c.append(st.pop()); on.discard(c[-1])
                if len(c) > 1: cycles.append(sorted(c))
        elif w not in idx:
            idx[w] = low[w] = len(idx); st.append(w); on.add(w); work.append((w, iter(sorted(g[w]))))
        elif w in on: low[u] = min(low[u], idx[w])
for v in sorted(g):
    if v not in idx: visit(v)
print("cycles: %d" % len(cycles))
for c in sorted(cycles, key=lambda c: (-len(c), c)): print("  %d: %s" % (len(c), " ".join(c)))
PY

echo "## branches on where the state lives, outside engine/train/state.c and engine/dist/"
dp=$(git grep -nE 'e->dp\b|e->offload\b|lora_r\b' -- 'engine/*.c' | grep -v -e engine/train/state.c -e engine/dist/)
echo "e->dp, e->offload, lora_r: $(printf '%s' "$dp" | grep -c .)"
printf '%s\n' "$dp" | grep . | cut -d: -f1 | sort | uniq -c | sort -rn | sed 's/^ */  /'
ep=$(git grep -nE 'e->ep(_full)?\b' -- 'engine/*.c' | grep -v -e engine/train/state.c -e engine/train/ep.c -e engine/dist/)
echo "e->ep, e->ep_full (also outside engine/train/ep.c): $(printf '%s' "$ep" | grep -c .)"
printf '%s\n' "$ep" | grep . | cut -d: -f1 | sort | uniq -c | sort -rn | sed 's/^ */  /'
inside=$(git grep -l '#include "engine/engine_internal.h"' -- 'engine/*/*')
echo "files in the rooms that see struct eng (engine_internal.h): $(echo "$inside" | grep -c .)" \
  "($(echo "$inside" | cut -d/ -f2 | sort | uniq -c | awk '{ printf "%s%s %d", (NR > 1 ? ", " : ""), $2, $1 }'));" \
  "its members: $(sed -n '/^struct eng {/,/^};/p' engine/engine_internal.h | grep -cE '^[[:space:]]+[a-z_]+[ *]+[a-z_]')"
echo "'dp ? … :' at the call sites (engine.c, plan.c, update.c, checkpoint.c, snapshot.c):" \
  "$(grep -nE '\bdp \?|e->dp \?|e->offload \?' engine/engine.c engine/plan.c \
    engine/train/update.c engine/train/checkpoint.c engine/train/snapshot.c | wc -l)"

# reach WORD...: the source files (not tests, not docs) that name any of the words
reach() { git grep -lwE "$(IFS='|'; echo "$*")" -- $floors | sort; }
show() { local what=$1; shift; local files; files=$(reach "$@")
  echo "$what: $(echo "$files" | grep -c .) files"; echo "$files" | sed 's/^/  /'; }

echo "## places an existing one reaches (what adding one like it touches)"
# a route: its row names the handler, and the handler's file defines it
show "route DELETE /v1/jobs/{id} (api_job_delete)" api_job_delete
# a request field: a sampling knob (its row, its member, the samplers and where the rollout
# copies it) and a job-level member (its row, its member, where the job reads it)
show "sampling field min_p" min_p
show "job-level field expected_policy_version" expected_policy_version
# an op: its files by base name and the backend table's entry and wrappers
op=rmsnorm
echo "op $op: $(git ls-files "kernels/$op.*" "kernels/${op}_cpu.c" | wc -l) files by its name in kernels/" \
  "($(git ls-files "kernels/$op.*" "kernels/${op}_cpu.c" | tr '\n' ' ')), the backend table" \
  "$(git grep -lwE "${op}_fwd|${op}_bwd|cpu_${op}_fwd|cu_${op}_fwd" -- engine/backend | tr '\n' ' ')," \
  "the tests $(git grep -lw "${op}_fwd" -- tests/unit tests/gpu/test_ops.c | tr '\n' ' ')"
