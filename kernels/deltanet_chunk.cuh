/* deltanet_chunk.cuh — the chunked forward of the gated delta rule (deltanet_chunk.cu), called by
 * deltanet_rule_fwd_cuda (deltanet.cu) after its prep kernel. Not a public op: include it from
 * deltanet.cu only. Legend as deltanet.h (T, Hk, Hv, Dk, Dv). */
#ifndef GRPOD_KERNELS_DELTANET_CHUNK_CUH
#define GRPOD_KERNELS_DELTANET_CHUNK_CUH
#include "kernels/common.cuh"
#include "kernels/deltanet.h"

/* deltanet_prev() on device ranges */
__device__ __forceinline__ int dn_prev(attn_ranges r, int t) {
    int b0 = r.b0[t], b1 = r.b1[t], a0 = r.a0[t], a1 = r.a1[t];
    if (b1 > b0) return t > b0 ? t - 1 : (a1 > a0 ? a1 - 1 : -1);
    return t > a0 ? t - 1 : -1;
}

/* 1 when the chunked forward takes these dims (Dk <= 128; else the recurrent walk runs) */
int dn_chunk_ok(int Dk);
/* the floats of its scratch at T tokens (laid out by dn_chunk_fwd from `scr`) */
long long dn_chunk_floats(int T, int Hv, int Dk, int Dv);
/* o (T,Hv,Dv) written (unless NULL) from qn, kn (T,Hk,Dk), g, beta (T,Hv) (dn_prep_kernel's) and
 * u's v slice; ck (unless NULL): the state after each token ≡ 63 (mod 64), (T/64+1, Hv, Dk, Dv) */
void dn_chunk_fwd(cu_ctx *c, bf16 *o, float *ck, float *scr, const float *qn, const float *kn, const float *g, const float *beta,
                  const bf16 *u, attn_ranges r, int T, int Hk, int Hv, int Dk, int Dv);
#endif
