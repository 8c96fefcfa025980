#!/usr/bin/env python3
"""attn_vs_sdpa.py — grpod's packed shared-prefix attention on the CUDA backend against PyTorch
scaled_dot_product_attention on the unpacked N(P+R) layout, output and every gradient.

For each case, tests/gpu/attn_dump (built by tests/gpu/run.sh) runs the packed [P; R_1 .. R_N]
forward and backward on random bf16 inputs and writes them as float32. Here each response
becomes its own causal sequence [P; R_i], gathered from the same leaf tensors in float64 (so
autograd sums the N responses' prompt gradients, the quantity grpod accumulates in fp32). The
prompt's output gradient enters through the first response's copy only, so both layouts have the
same loss. Prints ROW lines (relative L2, bound 1e-2) for run.sh's table.
Usage: python3 tests/gpu/attn_vs_sdpa.py BIN_DIR
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

# (name, H, K, D, [(P, [R_1 .. R_N]) per group]): odd P and R, P below a tile, R = 1, N = 1,
# several groups with different P in one call, head dims 64 and 256, and a step-like shape
CASES = [
    ("P=300 N=4, odd R", 8, 2, 128, [(300, [77, 1, 130, 64])]),
    ("P<tile N=1 R=1", 4, 1, 128, [(37, [1])]),
    ("N=1", 4, 2, 128, [(200, [129])]),
    ("3 groups, P 129/1/513", 8, 4, 128, [(129, [5, 64]), (1, [3]), (513, [200, 17, 1])]),
    ("D=64", 6, 3, 64, [(100, [33, 70])]),
    ("P=1024 N=8 R=256", 16, 8, 128, [(1024, [256] * 8)]),
    ("D=256 Qwen3.5 heads", 16, 4, 256, [(300, [77, 1, 130, 64]), (65, [3, 200])]),
]


def run_case(bin_dir, name, H, K, D, groups, seed):
    with tempfile.TemporaryDirectory() as d:
        args = [os.path.join(bin_dir, "attn_dump"), d, str(H), str(K), str(D), str(seed), str(len(groups))]
        for P, Rs in groups:
            args += [str(P), str(len(Rs))] + [str(r) for r in Rs]
        subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
        T = sum(P + sum(Rs) for P, Rs in groups)

        def ld(n, heads):
            a = np.fromfile(os.path.join(d, n + ".f32"), dtype=np.float32).reshape(T, heads, D)
            return torch.from_numpy(a).double().cuda()
        q, k, v, dout = ld("q", H), ld("k", K), ld("v", K), ld("dout", H)
        got = {"out": ld("out", H), "dq": ld("dq", H), "dk": ld("dk", K), "dv": ld("dv", K)}
    for x in (q, k, v):
        x.requires_grad_()
    out = torch.zeros(T, H, D, dtype=torch.float64, device="cuda")
    loss, t = 0.0, 0
    for P, Rs in groups:
        prompt = torch.arange(t, t + P, device="cuda")
        s = t + P
        for i, R in enumerate(Rs):
            idx = torch.cat([prompt, torch.arange(s, s + R, device="cuda")])
            qs = q[idx].transpose(0, 1)[None]
            ks = k[idx].transpose(0, 1).repeat_interleave(H // K, 0)[None]
            vs = v[idx].transpose(0, 1).repeat_interleave(H // K, 0)[None]
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)[0].transpose(0, 1)
            w = dout[idx].clone()
            if i > 0:
                w[:P] = 0
            loss = loss + (o * w).sum()
            if i == 0:
                out[t:t + P] = o[:P].detach()
            out[s:s + R] = o[P:].detach()
            s += R
        t = s
    loss.backward()
    ref = {"out": out, "dq": q.grad, "dk": k.grad, "dv": v.grad}
    fails = 0
    for n in ("out", "dq", "dk", "dv"):
        err = ((got[n] - ref[n]).norm() / ref[n].norm()).item()
        ok = err <= 1e-2
        fails += not ok
        print(f"ROW|attention vs SDPA unpacked: {n}|{name} T={T} H={H} K={K} D={D}|{err:.3e}|1e-02|"
              f"{'PASS' if ok else 'FAIL'}", flush=True)
    return fails


def main():
    bin_dir = sys.argv[1] if len(sys.argv) > 1 else "build/gpu"
    fails = sum(run_case(bin_dir, *c, seed=1000 + 10 * i) for i, c in enumerate(CASES))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
