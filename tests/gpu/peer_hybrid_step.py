# Peer benchmark for bench_hybrid: one Qwen3.5 layer pair (a gated DeltaNet layer, then a gated
# full-attention layer), forward+backward, bf16, in PyTorch: transformers' Qwen3_5DecoderLayer at the
# HF default text config (Qwen3.5-9B dims: C 4096, F 12288; DeltaNet 16 key / 32 value heads,
# Dk = Dv = 128, 4 conv taps; attention 16 heads, 4 KV heads, D 256, a quarter rotary), with
# flash-linear-attention's chunk_gated_delta_rule (Triton) in place of transformers' torch
# fallback, on the N(P+R) layout: N sequences [P; R_i], the prompt replicated N times (the form a
# PyTorch user trains; fla has no shared-prefix state). SDPA for the full attention.
# bench_hybrid's gated layer is the same (H 16, K 4, D 256).
# Usage: PYTHONPATH=<fla-core + einops wheels unpacked> [PEER_FLA_TIMING_ONLY=1] python3 peer_hybrid_step.py
#        [P,N,R ...]  (default 4096,16,512); PEER_FLA_TIMING_ONLY=1 lifts fla's refusal of Triton 3.4-3.7.0 on
#        Hopper (bypass_triton_guard): the time is measured, the gradients are not to be trusted
# Prints ms per layer and pass (median of timed iterations), peak GiB, and the projection to
# Qwen3.5-9B's 32 layers (24 DeltaNet, 8 gated attention), layers only, as bench_hybrid does.
# Step mode: python3 peer_hybrid_step.py step [L [P N R [MB]]]  (default 4 4096 16 512 4): one whole
# GRPO update step (old pass + ref pass + policy fwd/bwd + clip + fused AdamW) of
# transformers' Qwen3_5ForCausalLM at the HF default text config (Qwen3.5-9B) on L layers (every
# fourth full attention, as layer_types), random weights, fla's chunk_gated_delta_rule, N sequences
# [P; R_i] in micro-batches of MB with gradient checkpointing and logits only at the response
# positions (TRL's form; peer_step.py's hf-std), beside `bench_step qwen3.5-9b-lL P N R`.
import statistics
import sys

import torch

dev = "cuda"
REPS = 5


def fla_rule():
    """fla's chunk_gated_delta_rule, or exit saying exactly why it will not import."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except Exception as e:  # noqa: BLE001 (the reason is the output)
        print(f"peer-fla: flash-linear-attention does not import: {type(e).__name__}: {e}")
        sys.exit(2)
    bypass_triton_guard()
    return chunk_gated_delta_rule


def bypass_triton_guard():
    """fla 0.6 refuses its gated backward on Hopper with Triton >= 3.4, < 3.7.1 (wrong
    dq/dk/dg from a Triton bug). With PEER_FLA_TIMING_ONLY=1 the guard is lifted so the peer's time
    can be measured on such an image: its gradients are then not to be trusted, only its time."""
    import os
    import triton
    import fla.ops.common.chunk_o as co
    if getattr(co, "TRITON_ABOVE_3_7_1", True) or os.environ.get("PEER_FLA_TIMING_ONLY") != "1":
        return
    co.TRITON_ABOVE_3_7_1 = True
    print(f"peer-fla: triton {triton.__version__} is in fla's known-bad range on Hopper (a Triton bug in its gated backward); guard lifted "
          "(PEER_FLA_TIMING_ONLY=1): timing only, its dq/dk/dg may be wrong")


def patch_fla(mq, model_layers):
    """Every gated DeltaNet layer of transformers' Qwen3.5 module calls fla's chunked rule (counted)"""
    rule, calls = fla_rule(), [0]

    def fla(query, key, value, g, beta, initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False,
            cu_seqlens=None, **kw):
        calls[0] += 1
        return rule(query, key, value, g=g, beta=beta, initial_state=initial_state,
                    output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                    cu_seqlens=cu_seqlens)

    mq.torch_chunk_gated_delta_rule = fla  # the name the layer's forward calls (transformers 5)
    for l in model_layers:
        if hasattr(l, "linear_attn") and hasattr(l.linear_attn, "chunk_gated_delta_rule"):
            l.linear_attn.chunk_gated_delta_rule = fla  # older transformers: an attribute of the layer
    return calls


def step_main(argv):
    """The whole GRPO update step at Qwen3.5-9B dims on L layers (see the header)"""
    import time
    from transformers.models.qwen3_5 import modeling_qwen3_5 as mq
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig

    L = int(argv[0]) if argv else 4
    P, N, R = (int(v) for v in argv[1:4]) if len(argv) > 3 else (4096, 16, 512)
    MB = int(argv[4]) if len(argv) > 4 else 4
    cfg = Qwen3_5TextConfig(num_hidden_layers=L,
                            layer_types=["full_attention" if i % 4 == 3 else "linear_attention" for i in range(L)])
    cfg._attn_implementation = "sdpa"
    V = cfg.vocab_size
    print(f"peer-fla step config: L={L} C={cfg.hidden_size} F={cfg.intermediate_size} V={V} tied={cfg.tie_word_embeddings}"
          f" lin heads {cfg.linear_num_key_heads}/{cfg.linear_num_value_heads} attn H={cfg.num_attention_heads}"
          f" K={cfg.num_key_value_heads} D={cfg.head_dim}; P={P} N={N} R={R} MB={MB}; torch {torch.__version__}", flush=True)

    def build():
        torch.manual_seed(0)
        with torch.device(dev):
            m = mq.Qwen3_5ForCausalLM(cfg).to(torch.bfloat16)
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        m.config.use_cache = False
        return m

    t00 = time.time()
    model, ref = build(), build().eval()
    for p_ in ref.parameters():
        p_.requires_grad_(False)
    calls = patch_fla(mq, list(model.model.layers) + list(ref.model.layers))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)
    g = torch.Generator(device=dev).manual_seed(1)
    prompt = torch.randint(0, 150000, (P,), device=dev, generator=g)
    resp = torch.randint(0, 150000, (N, R), device=dev, generator=g)
    adv = torch.randn(N, device=dev, generator=g)
    seqs = torch.cat([prompt[None].expand(N, P), resp], 1)

    def lps(m, s):
        logits = m(input_ids=s, logits_to_keep=R + 1).logits[:, :-1].float()
        return torch.gather(logits, 2, s[:, P:, None]).squeeze(2) - torch.logsumexp(logits, 2)

    def timed(fn):
        torch.cuda.synchronize()
        t = time.time()
        out = fn()
        torch.cuda.synchronize()
        return out, time.time() - t

    def one():
        t = {}
        with torch.no_grad():
            old, t["old"] = timed(lambda: torch.cat([lps(model, seqs[i:i + MB]) for i in range(0, N, MB)]))
            _, t["ref"] = timed(lambda: torch.cat([lps(ref, seqs[i:i + MB]) for i in range(0, N, MB)]))

        def pol():
            for i in range(0, N, MB):
                ratio = torch.exp(lps(model, seqs[i:i + MB]) - old[i:i + MB])
                a = adv[i:i + MB, None]
                (-torch.min(ratio * a, ratio.clamp(0.8, 1.28) * a).mean() * MB / N).backward()
        _, t["policy"] = timed(pol)

        def optim():
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        _, t["optim"] = timed(optim)
        return t

    print(f"peer-fla step: models built in {time.time() - t00:.1f} s", flush=True)
    torch.cuda.reset_peak_memory_stats()
    try:
        t0 = time.time()
        w = one()  # warm-up: Triton compiles and autotunes fla's kernels here
        print(f"peer-fla step warm-up {time.time() - t0:.1f} s (Triton compile + autotune; old {w['old']:.1f} s, ref "
              f"{w['ref']:.1f}, policy {w['policy']:.1f})", flush=True)
        res = [one() for _ in range(3)]
    except torch.OutOfMemoryError:
        print(f"peer-fla step L={L} P={P} N={N} R={R}: out of memory")
        return
    med = {k: statistics.median(r[k] for r in res) for k in res[0]}
    print(f"peer-fla step qwen3.5-9b-l{L} P={P} N={N} R={R} N(P+R)={N * (P + R)}: total {sum(med.values()) * 1e3:.0f} ms  "
          + "  ".join(f"{k} {v * 1e3:.0f}" for k, v in med.items())
          + f"  peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB; fla calls {calls[0]}", flush=True)


def main():
    if sys.argv[1:2] == ["step"]:
        return step_main(sys.argv[2:])
    from transformers.models.qwen3_5 import modeling_qwen3_5 as mq
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig

    cfg = Qwen3_5TextConfig(num_hidden_layers=2, layer_types=["linear_attention", "full_attention"], vocab_size=256)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    layers = [mq.Qwen3_5DecoderLayer(cfg, i).to(dev, torch.bfloat16) for i in range(2)]
    calls = patch_fla(mq, layers)
    rot = mq.Qwen3_5TextRotaryEmbedding(cfg).to(dev)
    C = cfg.hidden_size
    print(f"peer config: C={C} F={cfg.intermediate_size} lin heads {cfg.linear_num_key_heads}/{cfg.linear_num_value_heads}"
          f" Dk={cfg.linear_key_head_dim} Dv={cfg.linear_value_head_dim} attn H={cfg.num_attention_heads}"
          f" K={cfg.num_key_value_heads} D={cfg.head_dim}; torch {torch.__version__}")
    runs = [tuple(int(v) for v in a.split(",")) for a in sys.argv[1:]] or [(4096, 16, 512)]
    for P, N, R in runs:
        T = P + R
        try:
            bench(layers, rot, C, P, N, R, T, calls)
        except torch.OutOfMemoryError:
            print(f"peer-fla qwen3.5 layer pair P={P} N={N} R={R}: out of memory")
        torch.cuda.empty_cache()


def bench(layers, rot, C, P, N, R, T, calls):
    g = torch.Generator(device=dev).manual_seed(1)
    x0 = torch.randn(N, T, C, device=dev, dtype=torch.bfloat16, generator=g)
    dy = torch.randn(N, T, C, device=dev, dtype=torch.bfloat16, generator=g)
    pos = torch.arange(T, device=dev)[None, None].expand(3, N, T)
    pe = rot(x0, pos)
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(5)]
    times = [[] for _ in range(4)]  # DeltaNet fwd, gated fwd, gated bwd, DeltaNet bwd
    torch.cuda.reset_peak_memory_stats()
    for rep in range(REPS + 1):
        for l in layers:
            l.zero_grad(set_to_none=False)
        x = x0.clone().requires_grad_(True)
        ev[0].record()
        h = layers[0](x, position_embeddings=pe, attention_mask=None, position_ids=pos[0])
        h = h[0] if isinstance(h, tuple) else h
        ev[1].record()
        hd = h.detach().requires_grad_(True)
        y = layers[1](hd, position_embeddings=pe, attention_mask=None, position_ids=pos[0])
        y = y[0] if isinstance(y, tuple) else y
        ev[2].record()
        y.backward(dy)
        ev[3].record()
        h.backward(hd.grad)
        ev[4].record()
        torch.cuda.synchronize()
        if rep:
            for k in range(4):
                times[k].append(ev[k].elapsed_time(ev[k + 1]))
    med = [statistics.median(t) for t in times]
    dn, ga = med[0] + med[3], med[1] + med[2]
    print(f"peer-fla qwen3.5 layer pair P={P} N={N} R={R} N(P+R)={N * T}: fwd+bwd {sum(med):.2f} ms (deltanet fwd "
          f"{med[0]:.2f} bwd {med[3]:.2f}; gated attn fwd {med[1]:.2f} bwd {med[2]:.2f}); peak "
          f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB; |dx| {x.grad.float().norm():.3g}; fla calls {calls[0]}")
    print(f"peer-fla qwen3.5-9B projection P={P} N={N} R={R}: 24 DeltaNet + 8 gated attention layers fwd+bwd "
          f"{24 * dn + 8 * ga:.0f} ms (layers only)")


if __name__ == "__main__":
    main()
