/* tune.h — the tuning knobs of a backend: which kernel variant runs and how the engine drives
 * the backend. The defaults are the fastest paths measured (docs/benchmarks.md); every other
 * value is an A/B switch for a benchmark or a test, never needed for correctness.
 *
 * Read once, when a backend is created: backend_cuda_create fills eng_backend.tune from the
 * GRPOD_TUNE_* environment (engine/backend/tune.c; an unknown GRPOD_TUNE_ name or a bad value is an
 * error there); nothing reads the environment per call. The kernels' launchers read the
 * fields at each call through cu_ctx.tune, so a test or benchmark switches a variant by
 * setting be->tune.FIELD between ops (on the engine thread, like every backend call). */
#ifndef GRPOD_KERNELS_TUNE_H
#define GRPOD_KERNELS_TUNE_H

typedef enum { TUNE_ATTN_AUTO, TUNE_ATTN_SIMT } tune_attn;
enum { TUNE_SKINNY_OFF = 0, TUNE_SKINNY_FORCE = 1, TUNE_SKINNY_AUTO = -1 };
/* the experts' GEMMs (kernels/moe.cu): few is for tests (the decode kernel at any size); cublas
 * is grouped with cuBLAS's grouped GEMM for every problem instead of gemm_grouped.cu */
enum { TUNE_MOE_AUTO = -1, TUNE_MOE_TILES = 0, TUNE_MOE_GROUPED = 1, TUNE_MOE_FEW = 2, TUNE_MOE_CUBLAS = 3 };
/* the gated delta rule's training kernels: chunked (kernels/deltanet_chunk*.cu, where the head
 * dims allow) or the recurrent walk (kernels/deltanet.cu) */
enum { TUNE_DN_CHUNKED = 0, TUNE_DN_RECURRENT = 1 };

typedef struct {
    int graphs; /* GRPOD_TUNE_GRAPHS=0|1: decode steps captured and replayed as CUDA graphs */
    int pdl; /* GRPOD_TUNE_PDL=0|1: programmatic dependent launch on the decode chain */
    int attn_decode; /* GRPOD_TUNE_ATTN_DECODE=0|1: attention_decode.cu for few queries */
    tune_attn attn; /* GRPOD_TUNE_ATTN=auto|simt: simt runs the SIMT kernels at every head dim */
    int skinny; /* GRPOD_TUNE_SKINNY=auto|0|1: the few-row GEMM of matmul.cu: auto for
                         * T <= 16 and W up to 64M values, 0 never, 1 up to T = 64 and any size
                         * (exact mode runs it whatever this says: its order is exact mode's) */
    int moe; /* GRPOD_TUNE_MOE=auto|tiles|grouped|cublas: the MoE experts' GEMMs: auto the
                      * few-slot kernel up to 512 tokens and grouped GEMMs above; tiles the tiled
                      * kernels (batch-invariant); grouped the grouped GEMMs at every size;
                      * cublas those on cuBLAS's grouped GEMM */
    int exact; /* GRPOD_TUNE_EXACT=0|1: batch-invariant kernels: a row's result does not depend
                        * on the rows beside it; rollout logprobs equal the trainer's */
    int deltanet; /* GRPOD_TUNE_DELTANET=chunked|recurrent: the gated delta rule's training kernels */
} tune_opts;

static inline tune_opts tune_defaults(void) {
    tune_opts t = {1, 1, 1, TUNE_ATTN_AUTO, TUNE_SKINNY_AUTO, TUNE_MOE_AUTO, 0, TUNE_DN_CHUNKED};
    return t;
}
#endif
