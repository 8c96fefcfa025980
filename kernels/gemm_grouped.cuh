/* gemm_grouped.cuh — many independent bf16 GEMMs in one launch (tensor cores, fp32
 * accumulation), for the MoE experts' grouped GEMMs (moe_gemm.cu): every problem is
 *
 *   D (m x n, row-major, ldd) = Σ_i A_i (m x k_i) · B_i (k_i x n)   [+ beta·D when D is fp32]
 *
 * over up to GG_SRC products, with A read K-major (A(i,j) at a[i·lda + j]) or M-major
 * (a[j·lda + i]) and B K-major (B(j,c) at b[c·ldb + j]) or N-major (b[j·ldb + c]); all problems
 * and products of a launch share the three layouts. The operands' contiguous dimension must be
 * a multiple of 8 and every operand 16-byte aligned (gemm_grouped_fits); the other dimensions
 * are free (edges zero-filled). Two forms inside (gemm_grouped.cu: TMA where every problem is
 * wider than 128 columns with beta 0, or 1 in fp32; cp.async otherwise), the same sum order in
 * both.
 * Deterministic: one block computes an output tile and runs its K range in one fixed order (no
 * atomics, no split K), so the same problems give the same bits. */
#ifndef GRPOD_KERNELS_GEMM_GROUPED_CUH
#define GRPOD_KERNELS_GEMM_GROUPED_CUH
#include "kernels/common.cuh"

enum { GG_SRC = 3 };
/* one product A (m x k) · B (k x n) of a sum */
typedef struct {
    const bf16 *a, *b;
    int k, lda, ldb;
    int kept; /* bit 0: a, bit 1: b stays at its address across launches (a weight): its TMA
               * tensor map is worth keeping (gemm_grouped_free) */
} gg_src;
typedef struct {
    gg_src s[GG_SRC]; /* D = Σ_i s[i].a · s[i].b over the first ns, in one fp32 accumulator */
    int ns;
    void *d;
    int m, n, ldd;
    float beta;
    int tile0; /* the problem's first tile in the launch (filled by gemm_grouped_cuda) */
    int tiles_n; /* its tiles along n (filled alike) */
    int d_kept; /* d stays at its address across launches (a weight's gradient), as gg_src.kept */
} gg_prob;

typedef struct {
    int a_kmaj, b_kmaj, d_f32;
} gg_layout;

/* whether a problem can run here: contiguous dimensions multiples of 8, 16-byte pointers */
int gemm_grouped_fits(const gg_prob *p, gg_layout l);

/* Runs the np problems of p (host array; tile0 and tiles_n are written) on c's stream; dev
 * is device room for np problems (gemm_grouped_bytes), 64-byte aligned, reused once the launch
 * is queued. */
void gemm_grouped_cuda(cu_ctx *c, gg_prob *p, int np, gg_layout l, void *dev);
/* the host state gemm_grouped_cuda keeps in c (kept tensor maps, pinned staging), at context
 * destruction */
void gemm_grouped_free(cu_ctx *c);
/* the problems and, for the TMA form, a tensor map (128 bytes) for each operand of each product
 * and for the output */
static inline size_t gemm_grouped_bytes(int np) { return (size_t)np * (sizeof(gg_prob) + (2 * GG_SRC + 1) * 128); }
#endif
