/* sampling.cu — CUDA version of kernels/sampling.h. Every row's vocabulary is split into NB
 * chunks, one block each (NB from R: about four blocks per SM in all, 4..32 per row); each
 * kernel's last block of a row (a counter per row) merges the chunks' partials, so a phase is
 * one launch. Phases:
 *   stats:  per chunk max/sum of exp (the untruncated logsumexp), the eligible max and its id
 *           (greedy), and for untruncated sampling rows the best Gumbel score; the last block
 *           finishes greedy and untruncated rows (tok, logprob) at once.
 *   top_k:  for truncating rows, a 4-pass radix select (8 bits a pass, most significant first)
 *           of the k-th largest eligible value on its order-preserving 32-bit key: per pass a
 *           256-bin histogram of the ids matching the prefix so far (shared-memory atomics,
 *           then global), and the last block picks the bin.
 *   top_p:  the same select on mass (w = exp(z - z_max) in 2^-40 fixed point, so the sums do not
 *           depend on the order of the atomics) over the ids left by top_k and min_p; the first
 *           pass's bins also give the total mass, hence the target.
 *   draw:   Gumbel-max over the kept set, the last block writes tok and logprob.
 * Rows that a phase does not concern return at once. The grid depends only on R, so the op can
 * be captured in a CUDA graph; the per-row state lives in the context's scratch and is zeroed
 * (one memset) at the start of each call. Only tok and logprob (R ints, R floats) are written.
 * Exact mode (tune.exact): the chunks' merge depends on NB, hence on R, so the reported logprob
 * is then recomputed by the logprob head's row order (logprob_row.cuh): the trainer's value. */
#include "kernels/sampling.cuh"
#include "kernels/logprob_row.cuh"

enum { SAMP_THREADS = 256, SAMP_LOCAL_BAN = 64 };

typedef struct {
    unsigned done; /* blocks of the current phase finished (last block resets) */
    int k_off; /* top_k keeps everything (k >= eligible ids) */
    int arg_e; /* greedy pick (fallback when nothing is kept) */
    float zmax_e, lse;
    unsigned prefix; /* radix prefix found so far */
    unsigned key_k, key_p; /* thresholds on the value key (0: none) */
    unsigned long long rem; /* count / mass still to find below the prefix */
    unsigned long long hist[256];
} samp_state;

typedef struct {
    float m, s, me;
    int ae;
    float best;
    int bi;
} samp_part;

__device__ __forceinline__ unsigned samp_key(float z) {
    unsigned u = __float_as_uint(z);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Ban ids inside [c0, c1) into shared memory; returns their count, or -1 when there are more
 * than SAMP_LOCAL_BAN (then the global list is searched). Contains __syncthreads(). */
__device__ int samp_local_ban(int *loc, int *n_s, const int *ban, int use, int c0, int c1) {
    if (threadIdx.x == 0) *n_s = 0;
    __syncthreads();
    int n = use && ban ? ban[0] : 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        int id = ban[1 + i];
        if (id >= c0 && id < c1) {
            int k = atomicAdd(n_s, 1);
            if (k < SAMP_LOCAL_BAN) loc[k] = id;
        }
    }
    __syncthreads();
    int k = *n_s;
    return k > SAMP_LOCAL_BAN ? -1 : k;
}
/* The row's allow mask (its W words), or NULL. */
__device__ __forceinline__ const uint32_t *samp_mask(const uint32_t *allow, const sample_params &p, int V) {
    return allow && p.allow > 0 ? allow + (size_t)(p.allow - 1) * sampling_mask_words(V) : NULL;
}
/* Banned (the ban list) or outside the row's allow mask. */
__device__ __forceinline__ bool samp_banned(int j, const int *loc, int nloc, const int *ban, const uint32_t *mask) {
    if (sampling_masked(mask, j)) return true;
    if (nloc == 0) return false;
    if (nloc > 0) {
        for (int i = 0; i < nloc; i++)
            if (loc[i] == j) return true;
        return false;
    }
    for (int i = 1; i <= ban[0]; i++)
        if (ban[i] == j) return true;
    return false;
}

/* 1 in every thread of the row's last block to finish (threadfence reduction). */
__device__ bool samp_last(unsigned *done, int nb) {
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned v = atomicAdd(done, 1u);
        last = v == (unsigned)nb - 1;
        if (last) *done = 0;
    }
    __syncthreads();
    if (last) __threadfence();
    return last;
}

/* (value, id) max with the lowest id on ties; id < 0 is "none". */
__device__ __forceinline__ void samp_better(float &v, int &i, float v2, int i2) {
    if (i2 < 0) return;
    if (i < 0 || v2 > v || (v2 == v && i2 < i)) {
        v = v2;
        i = i2;
    }
}
__device__ __forceinline__ void warp_best(float &v, int &i) {
    for (int o = 16; o > 0; o >>= 1) {
        float v2 = __shfl_xor_sync(0xffffffffu, v, o);
        int i2 = __shfl_xor_sync(0xffffffffu, i, o);
        samp_better(v, i, v2, i2);
    }
}
/* Block-wide (value, id) max; every thread gets it. */
__device__ void block_best(float &v, int &i) {
    __shared__ float sv[32];
    __shared__ int si[32];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    warp_best(v, i);
    __syncthreads();
    if (lane == 0) {
        sv[w] = v;
        si[w] = i;
    }
    __syncthreads();
    v = lane < nw ? sv[lane] : -INFINITY;
    i = lane < nw ? si[lane] : -1;
    warp_best(v, i);
}

__global__ void samp_stats_kernel(int *tok, float *logprob, samp_state *st, samp_part *part, const float *logits,
                                  const sample_params *prm, const int *ban, const uint32_t *allow, int V, int chunk) {
    __shared__ float red[32];
    __shared__ int loc[SAMP_LOCAL_BAN], nloc_s;
    const int r = blockIdx.y, nb = gridDim.x, c0 = blockIdx.x * chunk, c1 = min(V, c0 + chunk);
    const sample_params p = prm[r];
    const uint32_t *mask = samp_mask(allow, p, V);
    const float *x = logits + (size_t)r * V;
    const float T = p.temperature > 0 ? p.temperature : 1.0f;
    const bool gumbel = p.temperature > 0 && !sampling_truncates(&p, V);
    const int nloc = samp_local_ban(loc, &nloc_s, ban, p.ban, c0, c1);
    float m = -INFINITY, s = 0.0f, me = -INFINITY, best = -INFINITY;
    int ae = -1, bi = -1;
    for (int j = c0 + threadIdx.x; j < c1; j += blockDim.x) {
        float z = x[j] * (1.0f / T);
        if (z > m) {
            s = s * __expf(m - z) + 1.0f;
            m = z;
        } else if (z > -INFINITY) s += __expf(z - m);
        if (samp_banned(j, loc, nloc, ban, mask)) continue;
        if (ae < 0 || z > me) {
            me = z;
            ae = j;
        }
        if (gumbel) {
            float sc = z + sampling_gumbel(p.key, j);
            if (bi < 0 || sc > best) {
                best = sc;
                bi = j;
            }
        }
    }
    float M = block_max(m, red);
    float S = block_sum(m == -INFINITY ? 0.0f : s * __expf(m - M), red);
    block_best(me, ae);
    block_best(best, bi);
    if (threadIdx.x == 0) part[r * nb + blockIdx.x] = (samp_part){M, S, me, ae, best, bi};
    if (!samp_last(&st[r].done, nb) || threadIdx.x >= 32) return;
    /* last block, warp 0: lane i merges chunk i (nb <= 32) */
    const int lane = threadIdx.x;
    samp_part q = {-INFINITY, 0.0f, -INFINITY, -1, -INFINITY, -1};
    if (lane < nb) {
        const samp_part *src = part + r * nb + lane;
        q.m = __ldcg(&src->m);
        q.s = __ldcg(&src->s);
        q.me = __ldcg(&src->me);
        q.ae = __ldcg(&src->ae);
        q.best = __ldcg(&src->best);
        q.bi = __ldcg(&src->bi);
    }
    float MM = warp_max(q.m);
    float SS = warp_sum(q.m == -INFINITY ? 0.0f : q.s * __expf(q.m - MM));
    warp_best(q.me, q.ae);
    warp_best(q.best, q.bi);
    if (lane) return;
    float lse = MM + logf(SS);
    int ae_all = q.ae < 0 ? 0 : q.ae;
    if (p.temperature <= 0 || gumbel) {
        int t = p.temperature <= 0 || q.bi < 0 ? ae_all : q.bi;
        tok[r] = t;
        logprob[r] = x[t] * (1.0f / T) - lse;
        return;
    }
    samp_state *w = &st[r];
    w->arg_e = ae_all;
    w->zmax_e = q.me;
    w->lse = lse;
    w->prefix = 0;
    w->key_k = 0;
    w->key_p = 0;
    w->k_off = 0;
    w->rem = (unsigned long long)p.top_k;
}

/* Warp 0 of the last block: the bin (descending) where the running count / mass reaches rem. */
__device__ void samp_select(samp_state *w, int pass, int mode, const sample_params &p, int V) {
    const int lane = threadIdx.x;
    unsigned long long h[8], ls = 0, tot;
    for (int i = 0; i < 8; i++) {
        h[i] = __ldcg(&w->hist[255 - 8 * lane - i]);
        ls += h[i];
    }
    unsigned long long inc = ls;
    for (int o = 1; o < 32; o <<= 1) {
        unsigned long long y = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += y;
    }
    tot = __shfl_sync(0xffffffffu, inc, 31);
    unsigned long long rem = w->rem;
    if (mode == 1 && pass == 0) { /* the nucleus target from the total mass */
        double t = (double)p.top_p * (double)tot;
        rem = t < 1.0 ? 1ULL : (unsigned long long)t;
    }
    unsigned long long before = inc - ls;
    unsigned hit = __ballot_sync(0xffffffffu, before < rem && inc >= rem);
    const int shift = 24 - 8 * pass;
    if (lane == 0 && !hit) { /* fewer ids than k (top_k keeps all); no mass (nothing kept) */
        if (mode == 0) {
            w->k_off = 1;
            w->key_k = 0;
        } else w->key_p = 0xffffffffu;
        w->prefix = 0;
    }
    if (hit && lane == __ffs(hit) - 1) {
        unsigned long long c = before;
        for (int i = 0; i < 8; i++) {
            if (c + h[i] >= rem) {
                unsigned b = 255 - 8 * lane - i;
                w->prefix |= b << shift;
                w->rem = rem - c;
                break;
            }
            c += h[i];
        }
        if (pass == 3) {
            if (mode == 0) w->key_k = w->prefix;
            else w->key_p = w->prefix;
            w->prefix = 0;
        }
    }
}

/* mode 0: top_k (count), mode 1: top_p (mass). */
__global__ void samp_radix_kernel(samp_state *st, const float *logits, const sample_params *prm, const int *ban,
                                  const uint32_t *allow, int V, int chunk, int pass, int mode) {
    __shared__ unsigned long long hs[256];
    __shared__ int loc[SAMP_LOCAL_BAN], nloc_s;
    const int r = blockIdx.y, nb = gridDim.x, c0 = blockIdx.x * chunk, c1 = min(V, c0 + chunk);
    const sample_params p = prm[r];
    const uint32_t *mask = samp_mask(allow, p, V);
    if (!sampling_truncates(&p, V)) return;
    if (mode == 0 ? !(p.top_k > 0 && p.top_k < V) : !(p.top_p < 1.0f)) return;
    samp_state *w = &st[r];
    if (mode == 0 && w->k_off) return;
    if (mode == 1 && w->key_p == 0xffffffffu) return;
    const float *x = logits + (size_t)r * V;
    const float T = p.temperature, zmax = w->zmax_e;
    const unsigned prefix = w->prefix, key_k = w->key_k, hmask = pass ? 0xffffffffu << (32 - 8 * pass) : 0u;
    const int shift = 24 - 8 * pass;
    for (int i = threadIdx.x; i < 256; i += blockDim.x) hs[i] = 0;
    const int nloc = samp_local_ban(loc, &nloc_s, ban, p.ban, c0, c1); /* syncs */
    for (int j = c0 + threadIdx.x; j < c1; j += blockDim.x) {
        float z = x[j] * (1.0f / T);
        unsigned u = samp_key(z);
        if ((u & hmask) != prefix || z == -INFINITY) continue;
        if (samp_banned(j, loc, nloc, ban, mask)) continue;
        if (mode == 0) {
            atomicAdd(&hs[(u >> shift) & 255], 1ULL);
            continue;
        }
        if (u < key_k) continue;
        float wv = expf(z - zmax);
        if (p.min_p > 0 && wv < p.min_p) continue;
        atomicAdd(&hs[(u >> shift) & 255], __float2ull_rn(wv * 1099511627776.0f));
    }
    __syncthreads();
    for (int i = threadIdx.x; i < 256; i += blockDim.x)
        if (hs[i]) atomicAdd(&w->hist[i], hs[i]);
    if (!samp_last(&w->done, nb)) return;
    if (threadIdx.x < 32) samp_select(w, pass, mode, p, V);
    __syncthreads();
    for (int i = threadIdx.x; i < 256; i += blockDim.x) w->hist[i] = 0;
}

__global__ void samp_draw_kernel(int *tok, float *logprob, samp_state *st, samp_part *part, const float *logits,
                                 const sample_params *prm, const int *ban, const uint32_t *allow, int V, int chunk) {
    __shared__ int loc[SAMP_LOCAL_BAN], nloc_s;
    const int r = blockIdx.y, nb = gridDim.x, c0 = blockIdx.x * chunk, c1 = min(V, c0 + chunk);
    const sample_params p = prm[r];
    const uint32_t *mask = samp_mask(allow, p, V);
    if (!sampling_truncates(&p, V)) return;
    samp_state *w = &st[r];
    const float *x = logits + (size_t)r * V;
    const float T = p.temperature, zmax = w->zmax_e;
    const unsigned key_k = w->key_k, key_p = w->key_p;
    const int nloc = samp_local_ban(loc, &nloc_s, ban, p.ban, c0, c1);
    float best = -INFINITY;
    int bi = -1;
    for (int j = c0 + threadIdx.x; j < c1; j += blockDim.x) {
        float z = x[j] * (1.0f / T);
        unsigned u = samp_key(z);
        if (z == -INFINITY || u < key_k || u < key_p) continue;
        if (p.min_p > 0 && expf(z - zmax) < p.min_p) continue;
        if (samp_banned(j, loc, nloc, ban, mask)) continue;
        float sc = z + sampling_gumbel(p.key, j);
        if (bi < 0 || sc > best) {
            best = sc;
            bi = j;
        }
    }
    block_best(best, bi);
    if (threadIdx.x == 0) part[r * nb + blockIdx.x].best = best, part[r * nb + blockIdx.x].bi = bi;
    if (!samp_last(&w->done, nb) || threadIdx.x >= 32) return;
    const int lane = threadIdx.x;
    float b = -INFINITY;
    int i = -1;
    if (lane < nb) {
        b = __ldcg(&part[r * nb + lane].best);
        i = __ldcg(&part[r * nb + lane].bi);
    }
    warp_best(b, i);
    if (lane) return;
    int t = i < 0 ? w->arg_e : i;
    tok[r] = t;
    logprob[r] = x[t] * (1.0f / T) - w->lse;
}

/* exact mode: logprob[r] = z_tok - lse as logprob_row_fwd_kernel computes it, z = logits / T */
__global__ void samp_exact_logprob_kernel(float *logprob, const int *tok, const float *logits, const sample_params *prm, int V) {
    const int r = blockIdx.x;
    const float T = prm[r].temperature > 0 ? prm[r].temperature : 1.0f, inv = 1.0f / T;
    const float *x = logits + (size_t)r * V;
    float lse, ez;
    row_stats(x, inv, V, &lse, &ez);
    if (threadIdx.x == 0) logprob[r] = x[tok[r]] * inv - lse;
}

void sample_cuda(cu_ctx *c, int *tok, float *logprob, const float *logits, const sample_params *p, const int *ban,
                 const uint32_t *allow, int R, int V) {
    if (c->failed || R <= 0) return;
    int nb = (4 * c->n_sm + R - 1) / R;
    nb = nb < 4 ? 4 : nb > 32 ? 32 : nb;
    int chunk = (V + nb - 1) / nb;
    nb = (V + chunk - 1) / chunk;
    size_t st_bytes = ((size_t)R * sizeof(samp_state) + 255) & ~(size_t)255;
    char *s = (char *)cu_scratch(c, st_bytes + (size_t)R * nb * sizeof(samp_part));
    if (!s) return;
    samp_state *st = (samp_state *)s;
    samp_part *part = (samp_part *)(s + st_bytes);
    CU_CK(c, cudaMemsetAsync(st, 0, (size_t)R * sizeof(samp_state), c->stream));
    dim3 grid(nb, R);
    samp_stats_kernel<<<grid, SAMP_THREADS, 0, c->stream>>>(tok, logprob, st, part, logits, p, ban, allow, V, chunk);
    CU_LAUNCHED(c, "samp_stats_kernel");
    for (int mode = 0; mode < 2; mode++)
        for (int pass = 0; pass < 4; pass++) {
            samp_radix_kernel<<<grid, SAMP_THREADS, 0, c->stream>>>(st, logits, p, ban, allow, V, chunk, pass, mode);
            CU_LAUNCHED(c, "samp_radix_kernel");
        }
    samp_draw_kernel<<<grid, SAMP_THREADS, 0, c->stream>>>(tok, logprob, st, part, logits, p, ban, allow, V, chunk);
    CU_LAUNCHED(c, "samp_draw_kernel");
    if (!cu_exact(c)) return;
    samp_exact_logprob_kernel<<<R, LOGPROB_ROW_THREADS, 0, c->stream>>>(logprob, tok, logits, p, V);
    CU_LAUNCHED(c, "samp_exact_logprob_kernel");
}
