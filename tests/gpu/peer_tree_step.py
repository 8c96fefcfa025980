# Peer benchmark for tests/bench/gpu/bench_trees.py: one update on tree-shaped groups with
# FlexAttention, on one GPU, random weights, using ../shared/bench/peer_step.py's packed model
# (Qwen3 dims, per-layer checkpointing, the head only where a token is predicted).
# A group is a prompt P, a trunk T that all N trajectories share, then a branch B of each's own.
#   flex-tree : [P; T; B_1..B_N] once per group, the mask kv <= q and (kv in P or T, or kv in q's
#               branch); trunk logprobs computed once and used by every trajectory's loss
#   flex-flat : [P; (T B)_1..(T B)_N] (the trunk repeated in each response: peer_step's layout)
# Per group: the old pass, the reference pass, the policy forward + backward; then one AdamW step.
# The agentic workload (8 trajectories x 4 turns, turns 1-2 shared) in the flat layout is flex-flat
# with T = turn 1 and B = turns 2-4: the peer has no tree deeper than one trunk. PEER_FORMS=flat
# (or tree) runs that form alone. The weights are made on the GPU (random, as peer_step's), and the
# seconds to import, build and compile are printed on stderr (tests/bench/gpu/tree_step.sh fits the
# whole comparison in a minute).
# Usage: python3 peer_tree_step.py PEER_STEP_DIR [1.7b] [G N P T B]   default 8 8 1024 1024 512
import sys, os, statistics, time, torch

t_start = time.time()

peer_dir = sys.argv[1]
size = sys.argv[2] if len(sys.argv) > 2 else "1.7b"
G, N, P, T, B = (int(x) for x in sys.argv[3:8]) if len(sys.argv) > 7 else (8, 8, 1024, 1024, 512)
sys.argv = ["peer_step.py", size, str(P), str(N), str(T + B), "4"]  # peer_step reads its dims from argv
sys.path.insert(0, peer_dir)
import peer_step as ps  # noqa: E402
from torch.nn.attention.flex_attention import create_block_mask  # noqa: E402

dev = ps.dev
torch.manual_seed(1)
prompts = torch.randint(0, 150000, (G, P), device=dev)
trunks = torch.randint(0, 150000, (G, T), device=dev)
branches = torch.randint(0, 150000, (G, N, B), device=dev)
advs = torch.randn(G, N, device=dev)


def layout(tree):
    """ids builder, positions, block mask, the positions to run the head at, and for each
    trajectory its T + B predictions as indexes into the head's rows."""
    if tree:
        L = P + T + N * B
        doc = torch.cat([torch.zeros(P + T, dtype=torch.int32),
                         torch.arange(1, N + 1, dtype=torch.int32).repeat_interleave(B)]).to(dev)
        pos = torch.cat([torch.arange(P + T), torch.arange(P + T, P + T + B).repeat(N)]).to(dev)
        trunk_pred = torch.arange(P - 1, P + T - 1, device=dev)                       # predicts trunk j
        br = P + T + torch.arange(N, device=dev)[:, None] * B + torch.arange(B, device=dev)[None] - 1
        br[:, 0] = P + T - 1                                                          # the trunk's last
        want = torch.cat([trunk_pred, br.reshape(-1)])
        rows = torch.cat([torch.arange(T, device=dev)[None].expand(N, T), T + torch.arange(N * B, device=dev).view(N, B)], 1)
    else:
        R = T + B
        L = P + N * R
        doc = torch.cat([torch.zeros(P, dtype=torch.int32), torch.arange(1, N + 1, dtype=torch.int32).repeat_interleave(R)]).to(dev)
        pos = torch.cat([torch.arange(P), torch.arange(P, P + R).repeat(N)]).to(dev)
        want = P + torch.arange(N, device=dev)[:, None] * R + torch.arange(R, device=dev)[None] - 1
        want[:, 0] = P - 1
        want = want.reshape(-1)
        rows = torch.arange(N * R, device=dev).view(N, R)
    bm = create_block_mask(lambda b, h, q, kv: (kv <= q) & ((doc[kv] == 0) | (doc[kv] == doc[q])), None, None, L, L, device=dev)
    return pos, bm, want, rows


def ids_of(g, tree):
    if tree:
        return torch.cat([prompts[g], trunks[g], branches[g].reshape(-1)])
    return torch.cat([prompts[g], torch.cat([trunks[g][None].expand(N, T), branches[g]], 1).reshape(-1)])


def group(model, ref, g, times, lay, tree):
    pos, bm, want, rows = lay
    ids = ids_of(g, tree)
    tgt = torch.cat([trunks[g][None].expand(N, T), branches[g]], 1)                   # (N, T + B)
    attn = lambda q, k, v: ps.flex(q, k, v, block_mask=bm, enable_gqa=True)
    def lps(m, ckpt):
        lg = m(ids, pos, attn, want, ckpt).float()                                     # (rows, V)
        lse = torch.logsumexp(lg, 1)
        return torch.gather(lg[rows], 2, tgt[..., None])[..., 0] - lse[rows]           # (N, T + B)
    with torch.no_grad():
        old, t = ps.timed(lambda: lps(model, False)); times["old"] += t
        _, t = ps.timed(lambda: lps(ref, False)); times["ref"] += t
    _, t = ps.timed(lambda: (ps.ppo_loss(lps(model, True), old, advs[g]) / G).backward()); times["policy"] += t


def step(model, ref, opt, tree, lay):
    times = {"old": 0.0, "ref": 0.0, "policy": 0.0}
    for g in range(G): group(model, ref, g, times, lay, tree)
    def upd():
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0); opt.step(); opt.zero_grad(set_to_none=True)
    _, times["optim"] = ps.timed(upd)
    return times


def run(name, tree, reps=2):
    torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    with torch.device(dev):
        model, ref = ps.Packed().to(torch.bfloat16), ps.Packed().to(torch.bfloat16).eval()
    for p_ in ref.parameters(): p_.requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)
    lay = layout(tree)
    try:
        torch.cuda.synchronize(); t1 = time.time()
        step(model, ref, opt, tree, lay)  # warm-up: compiles flex
        print(f"{name}: weights {t1 - t0:.1f} s, warm-up step (compiles) {time.time() - t1:.1f} s", file=sys.stderr, flush=True)
        res = [step(model, ref, opt, tree, lay) for _ in range(reps)]
    except torch.OutOfMemoryError:
        print(f"{name}: OOM", flush=True); return None
    med = {k: statistics.median(r[k] for r in res) for k in res[0]}
    tot = sum(med.values())
    toks = G * (P + T + N * B) if tree else G * (P + N * (T + B))
    print(f"{name}: total {tot*1e3:.0f} ms  " + "  ".join(f"{k} {v*1e3:.0f}" for k, v in med.items())
          + f"  ({toks} tokens)  peak {torch.cuda.max_memory_allocated()/2**30:.1f} GiB", flush=True)
    print(f"ROW|peer_tree_step|{name} {size} G={G} N={N} P={P} T={T} B={B}|{tot*1e3:.0f}|-|INFO", flush=True)
    del model, ref, opt
    return tot


if __name__ == "__main__":
    print(torch.cuda.get_device_name(), f"{size} G={G} N={N} P={P} trunk {T} branch {B}", flush=True)
    print(f"imports {time.time() - t_start:.1f} s", file=sys.stderr, flush=True)
    forms = os.environ.get("PEER_FORMS", "tree,flat").split(",")
    tt = run("flex-tree", True) if "tree" in forms else None
    tf = run("flex-flat", False) if "flat" in forms else None
    if tt and tf: print(f"flex: tree / flat = {tt / tf:.2f}", flush=True)
