# Peer benchmark for one GRPO update at Qwen3-30B-A3B dims (mixture of experts) on one GPU, random
# weights, in ../shared/bench/peer_step.py's style: G groups of one prompt P and N responses R, then
# one AdamW step. Per group: the old pass, the reference pass, the policy forward + backward.
#   hf   : transformers' Qwen3MoeForCausalLM (experts_implementation "grouped_mm", SDPA), N sequences
#          [P;R_i] in micro-batches of MB, gradient checkpointing, logits only at response positions
#   flex : same dims, the layers hand-built around transformers' own Qwen3MoeSparseMoeBlock
#          (grouped_mm experts), one packed [P;R_1..R_N] sequence with a FlexAttention shared-prefix
#          mask, per-layer checkpointing, lm-head only at response positions
# The router's balance loss is off in both (output_router_logits False), as in grpod's bench unless
# the checkpoint asks for it. L layers of the model's 48 (default 4: bench_daemon.py's 30b-a3b-l4);
# the whole model's training state does not fit one GPU.
# Usage: python3 peer_moe_step.py [L] [P N R MB G]   default 4  1024 16 512 4 8
# PEER_MOE_ONLY=flex-packed (or hf-std) runs that peer alone; PEER_MOE_REPS timed steps (2).
import os, sys, time, statistics, torch, torch.nn as nn, torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from torch.nn.attention.flex_attention import flex_attention, create_block_mask
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

L = int(sys.argv[1]) if len(sys.argv) > 1 else 4
P, N, R, MB, G = (int(x) for x in sys.argv[2:7]) if len(sys.argv) > 6 else (1024, 16, 512, 4, 8)
C, H, K, HD, V, E, TOPK, FM = 2048, 32, 4, 128, 151936, 128, 8, 768
dev = "cuda"
torch.manual_seed(0)
prompts = torch.randint(0, 150000, (G, P), device=dev)
resps = torch.randint(0, 150000, (G, N, R), device=dev)
advs = torch.randn(G, N, device=dev)
CFG = dict(vocab_size=V, hidden_size=C, intermediate_size=6144, moe_intermediate_size=FM, num_hidden_layers=L,
           num_attention_heads=H, num_key_value_heads=K, head_dim=HD, num_experts=E, num_experts_per_tok=TOPK,
           norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False,
           output_router_logits=False, rope_theta=1e6, rms_norm_eps=1e-6)


def config():
    return Qwen3MoeConfig(**CFG, attn_implementation="sdpa", experts_implementation="grouped_mm")


def randomize(m):
    with torch.no_grad():
        for n, p in m.named_parameters():
            if p.dim() >= 2: p.normal_(0, 0.02)
            else: p.fill_(1.0).add_(torch.randn_like(p), alpha=0.02)
    return m


def timed(fn):
    torch.cuda.synchronize(); t = time.time(); out = fn(); torch.cuda.synchronize(); return out, time.time() - t


def ppo_loss(lp, old, a):
    ratio = torch.exp(lp - old)
    return -torch.min(ratio * a[:, None], ratio.clamp(0.8, 1.28) * a[:, None]).mean()


def hf_group(model, ref, g, times):
    seqs = torch.cat([prompts[g][None].expand(N, P), resps[g]], 1)
    def lps(m, s):
        logits = m(input_ids=s, logits_to_keep=R + 1).logits[:, :-1].float()
        return torch.gather(logits, 2, s[:, P:, None]).squeeze(2) - torch.logsumexp(logits, 2)
    with torch.no_grad():
        old, t = timed(lambda: torch.cat([lps(model, seqs[i:i + MB]) for i in range(0, N, MB)])); times["old"] += t
        _, t = timed(lambda: torch.cat([lps(ref, seqs[i:i + MB]) for i in range(0, N, MB)])); times["ref"] += t
    def pol():
        for i in range(0, N, MB):
            (ppo_loss(lps(model, seqs[i:i + MB]), old[i:i + MB], advs[g, i:i + MB]) * MB / (N * G)).backward()
    _, t = timed(pol); times["policy"] += t


def rope(x, pos):
    inv = 1.0 / (1e6 ** (torch.arange(0, HD, 2, device=dev, dtype=torch.float32) / HD))
    f = pos.float()[:, None] * inv[None]
    cos, sin = torch.cat([f.cos()] * 2, -1).to(x.dtype)[:, None], torch.cat([f.sin()] * 2, -1).to(x.dtype)[:, None]
    return x * cos + torch.cat([-x[..., HD // 2:], x[..., :HD // 2]], -1) * sin


class Layer(nn.Module):
    def __init__(s, cfg):
        super().__init__()
        s.ln1, s.ln2, s.qn, s.kn = nn.RMSNorm(C, eps=1e-6), nn.RMSNorm(C, eps=1e-6), nn.RMSNorm(HD, eps=1e-6), nn.RMSNorm(HD, eps=1e-6)
        s.q, s.k, s.v = nn.Linear(C, H * HD, bias=False), nn.Linear(C, K * HD, bias=False), nn.Linear(C, K * HD, bias=False)
        s.o = nn.Linear(H * HD, C, bias=False)
        s.moe = Qwen3MoeSparseMoeBlock(cfg)

    def forward(s, x, pos, attn):
        T = x.shape[1]; h = s.ln1(x)
        q = rope(s.qn(s.q(h).view(1, T, H, HD)), pos); k = rope(s.kn(s.k(h).view(1, T, K, HD)), pos)
        v = s.v(h).view(1, T, K, HD)
        a = attn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2).reshape(1, T, H * HD)
        x = x + s.o(a)
        return x + s.moe(s.ln2(x))


class Packed(nn.Module):
    def __init__(s):
        super().__init__()
        cfg = config()
        s.emb = nn.Embedding(V, C); s.layers = nn.ModuleList(Layer(cfg) for _ in range(L)); s.norm = nn.RMSNorm(C, eps=1e-6)
        s.head = nn.Linear(C, V, bias=False)

    def forward(s, ids, pos, attn, want, ckpt):
        x = s.emb(ids)[None]
        for l in s.layers:
            x = checkpoint(l, x, pos, attn, use_reentrant=False) if ckpt else l(x, pos, attn)
        return s.head(s.norm(x[0, want]))  # only at the positions that predict response tokens


flex = torch.compile(flex_attention, dynamic=False)
T_PACK = P + N * R
doc = torch.cat([torch.zeros(P, dtype=torch.int32), torch.arange(1, N + 1, dtype=torch.int32).repeat_interleave(R)]).to(dev)
pos_pack = torch.cat([torch.arange(P), torch.arange(P, P + R).repeat(N)]).to(dev)
want = P + torch.arange(N, device=dev)[:, None] * R + torch.arange(R, device=dev)[None] - 1
want[:, 0] = P - 1
want = want.reshape(-1)


def flex_group(model, ref, g, times, bm):
    ids = torch.cat([prompts[g], resps[g].reshape(-1)])
    tgt = resps[g].reshape(-1)
    attn = lambda q, k, v: flex(q, k, v, block_mask=bm, enable_gqa=True)
    def lps(m, ckpt):
        lg = m(ids, pos_pack, attn, want, ckpt).float()
        return (torch.gather(lg, 1, tgt[:, None])[:, 0] - torch.logsumexp(lg, 1)).view(N, R)
    with torch.no_grad():
        old, t = timed(lambda: lps(model, False)); times["old"] += t
        _, t = timed(lambda: lps(ref, False)); times["ref"] += t
    _, t = timed(lambda: (ppo_loss(lps(model, True), old, advs[g]) / G).backward()); times["policy"] += t


def step(name, model, ref, opt, group):
    times = {"old": 0.0, "ref": 0.0, "policy": 0.0}
    for g in range(G): group(model, ref, g, times)
    def upd():
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0); opt.step(); opt.zero_grad(set_to_none=True)
    _, times["optim"] = timed(upd)
    return times


def run(name, build, group, reps=int(os.environ.get("PEER_MOE_REPS", "2"))):
    if os.environ.get("PEER_MOE_ONLY", name) != name: return None
    torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
    with torch.device(dev):  # the modules' own init on the device (randomize overwrites it): seconds, not a minute
        model, ref = randomize(build()), randomize(build()).eval()
    for p_ in ref.parameters(): p_.requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)
    try:
        step(name, model, ref, opt, group)  # warm-up (compiles flex)
        res = [step(name, model, ref, opt, group) for _ in range(reps)]
    except torch.OutOfMemoryError:
        print(f"{name}: OOM", flush=True); del model, ref, opt; return None
    med = {k: statistics.median(r[k] for r in res) for k in res[0]}
    tot = sum(med.values())
    print(f"{name}: total {tot*1e3:.0f} ms  " + "  ".join(f"{k} {v*1e3:.0f}" for k, v in med.items())
          + f"  peak {torch.cuda.max_memory_allocated()/2**30:.1f} GiB", flush=True)
    print(f"ROW|peer_moe_step|{name} L={L} G={G} P={P} N={N} R={R}|{tot*1e3:.0f}|-|INFO", flush=True)
    del model, ref, opt
    return tot


if __name__ == "__main__":
    print(torch.cuda.get_device_name(), f"30b-a3b dims, {L} layers, G={G} P={P} N={N} R={R} MB={MB}", flush=True)
    def hf():
        m = Qwen3MoeForCausalLM(config()).to(dev, torch.bfloat16)
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False}); m.config.use_cache = False
        return m
    t_hf = run("hf-std", hf, hf_group)
    bm = create_block_mask(lambda b, h, q, kv: (kv <= q) & ((doc[kv] == 0) | (doc[kv] == doc[q])), None, None, T_PACK, T_PACK,
                           device=dev)
    t_fx = run("flex-packed", lambda: Packed().to(dev, torch.bfloat16), lambda m, r, g, t: flex_group(m, r, g, t, bm))
    # useful work: active parameters per token (attention + router + top-k experts), attention, head
    act = L * (C * H * HD + 2 * C * K * HD + H * HD * C + E * C + TOPK * 3 * C * FM)
    att = 2 * P * P * H * HD + 4 * N * R * (P + R / 2) * H * HD
    fwd = G * (2 * act * (P + N * R) + 2 * C * V * N * R + L * att)
    flops = 2 * fwd + 3 * fwd  # old + ref forwards, policy fwd+bwd
    for n, t in (("hf-std", t_hf), ("flex-packed", t_fx)):
        if t: print(f"{n}: useful {flops/1e12:.0f} TFLOP (active parameters) -> {flops/t/1e12:.0f} TFLOP/s "
                    f"({flops/t/989e12*100:.0f}% of 989 dense bf16)", flush=True)
