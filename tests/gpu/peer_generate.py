# peer_generate.py — the decode peer of bench_rollout: Hugging Face transformers generate() on a
# random-weight Qwen3 model at Qwen3-1.7B or Qwen3-8B dims (bf16, sdpa attention, the default
# dynamic cache), G = 1 group: one P-token prompt, N samples of `new` tokens at temperature 1,
# top_p 1. Prints one PEER| line a size: ms per decode step (the whole generate over `new`, prefill
# included, so an upper bound) and tokens/s.
# Usage: python3 tests/gpu/peer_generate.py [1.7b|8b ...] [--P 1024] [--N 16] [--new 128]
import argparse
import time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

DIMS = {  # Qwen3's published dims
    "1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16, tie_word_embeddings=True),
    "8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32, tie_word_embeddings=False),
}


def run(size, P, N, new):
    cfg = Qwen3Config(vocab_size=151936, head_dim=128, num_key_value_heads=8, max_position_embeddings=40960, rope_theta=1e6,
                      **DIMS[size])
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        m = Qwen3ForCausalLM(cfg).eval()
    ids = torch.randint(0, 151000, (1, P), device="cuda").repeat(N, 1)
    kw = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, pad_token_id=0)
    with torch.no_grad():
        m.generate(ids, max_new_tokens=4, min_new_tokens=4, **kw)  # warm-up
        torch.cuda.synchronize()
        t = time.time()
        out = m.generate(ids, max_new_tokens=new, min_new_tokens=new, **kw)
        torch.cuda.synchronize()
        dt = time.time() - t
    gen = (out.shape[1] - P) * N
    print(f"PEER|transformers generate {size} P={P} N={N} new={new}|{dt / new * 1e3:.2f} ms/step|{gen / dt:.0f} tok/s",
          flush=True)
    del m
    torch.cuda.empty_cache()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("sizes", nargs="*", default=["1.7b"])
    ap.add_argument("--P", type=int, default=1024)
    ap.add_argument("--N", type=int, default=16)
    ap.add_argument("--new", type=int, default=128)
    a = ap.parse_args()
    for s in a.sizes:
        run(s, a.P, a.N, a.new)
