# ncu_decode_steps.py — kernels per decode step, and their times, from an Nsight Compute CSV of
# bench_lora's timed rollouts (with adapters, then without). Run on the GPU machine:
#   ncu --profile-from-start off --clock-control none --cache-control none --graph-profiling node \
#       --metrics gpu__time_duration.sum --csv build/gpu/bench_lora --decode-only 8b 32 4096 16 512 \
#       1024 16 2 > steps.csv
#   python3 tools/gpu/ncu_decode_steps.py steps.csv branch
# Each forward starts with embedding_fwd; a rollout is its prefill (no few-row kernel) then its
# decode steps (few-row kernels), so the forwards split into the two phases. Kernel times are
# ncu's: each kernel alone, serialized (no overlap between launches, as a graph replay has).
import csv, sys, collections
lines = [l for l in open(sys.argv[1]) if l.startswith('"')]
if not lines: print(sys.argv[2], "no ncu rows"); sys.exit()
rows = list(csv.reader(lines))
hdr, rows = rows[0], rows[1:]
ki, vi, ui = hdr.index("Kernel Name"), hdr.index("Metric Value"), hdr.index("Metric Unit")
sc = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
ks = [(r[ki], float(r[vi].replace(",", "")) * sc.get(r[ui], 1.0)) for r in rows]
fw, cur = [], []
for k in ks:
    if "embedding_fwd" in k[0] and cur: fw.append(cur); cur = []
    cur.append(k)
if cur: fw.append(cur)
phases, p = [[], []], -1
for f in fw:
    dec = any("skinny" in n for n, _ in f)
    if not dec: p += 1; continue   # a prefill starts the next phase
    if 0 <= p < 2: phases[p].append(f)
print(f"{sys.argv[2]}: {len(ks)} kernels profiled, {len(fw)} forwards, decode steps {len(phases[0])} / {len(phases[1])}")
for name, steps in zip(("with adapters", "without"), phases):
    if not steps: continue
    n = len(steps)
    tot = sum(t for f in steps for _, t in f) / n
    c = collections.OrderedDict()
    for f in steps:
        for nm, t in f:
            k = nm.split("(")[0].replace("void ", "")[:56]
            c.setdefault(k, [0, 0.0]); c[k][0] += 1; c[k][1] += t
    print(f"  {name}: {sum(len(f) for f in steps) / n:.0f} kernels a decode step, {tot:.0f} us summed (isolated, serialized)")
    for k, (m, t) in sorted(c.items(), key=lambda x: -x[1][1]):
        print(f"     {m / n:6.0f} a step x {t / m:8.2f} us = {t / n:8.1f} us  {k}")
