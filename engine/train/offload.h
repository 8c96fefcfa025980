/* offload.h — the optimizer with its state in host memory (`--optimizer-offload`).
 *
 * Where each buffer lives (n parameters):
 *   device: bf16 weights the ops read (2n bytes), fp32 gradients (4n; see below), reference.
 *   host:   fp32 master weights and both AdamW moments (12n; 8n with bf16 moments,
 *           --optimizer-moments bf16), in ordinary memory: the GPU never
 *           reads them, so they need no pinning; only the staging ring below is pinned.
 * One step (offload_adamw), after the backward and the clip, which stay on the device:
 *   gradient chunk i   ──lane 1 (D2H)──►  pinned stage g[i % S]
 *   host AdamW on chunk i (adamw_bf16_cpu: adamw_cpu's element math, OpenMP + SIMD), writing
 *   the new bf16 weights into pinned stage a[i % S]
 *   stage a[i % S]     ──lane 2 (H2D)──►  the device weights
 * so the three overlap (a ring of S stages, the copy of chunk i + S - 1 in flight while chunk i
 * is computed); the op stream waits for the last upload, the calling thread does not.
 * Why the host and not the GPU for the update: with the state on the host a GPU variant moves
 * 24 bytes a parameter over PCIe (master and moments up and back) against 6 here (gradient
 * down, bf16 weights up), and both pass the state through host memory once (30 bytes a
 * parameter here, 24 by DMA there). Measured on an H100 host (docs/benchmarks.md, "Optimizer state in host memory"):
 * PCIe 55 GB/s each way, 89-95 together; host memory 67-110 GB/s. The 6 bytes here hide behind
 * the host compute (6 ms of waiting at 8B dims); the GPU variant's floor, 2.1 s at 8B dims,
 * is within ~20% of this path's 2.6-2.9 s and would need device staging: not built.
 * The step cannot start before the backward ends (the global-norm clip needs every gradient),
 * so at 8B dims it is exposed: ~2.7 s on top of 2.1 s of compute (docs/benchmarks.md).
 * Gradients stay fp32 on the device for the whole mini-batch (micro-batches accumulate there):
 * the same numbers as without offload; what frees the room for them is the 12n that moved.
 * On the cpu backend the copies are memmove and the result is bit-equal to be->adamw.
 * Legend: n parameters. Only the engine thread calls these. */
#ifndef GRPOD_OFFLOAD_H
#define GRPOD_OFFLOAD_H
#include "engine/backend/backend.h"
#include "kernels/adamw.h"

enum { OFFLOAD_STAGES = 3 };
#define OFFLOAD_CHUNK (16LL << 20) /* elements per transfer by default */

typedef struct {
    eng_backend *be;
    long long n, chunk; /* parameters; elements per transfer */
    float *gstage[OFFLOAD_STAGES]; /* (chunk) fp32 gradients, pinned */
    void *astage[OFFLOAD_STAGES]; /* (chunk) act-typed weights, pinned */
    int m16; /* the moments are bf16 (--optimizer-moments bf16: adamw_m16_cpu), else fp32 */
    double ms_host, ms_wait; /* last step: AdamW on the host, waiting for copies */
    adamw_bad bad; /* the elements stepped not finite (kernels/adamw.h), added to by each call */
} eng_offload;

/* chunk <= 0: the default (OFFLOAD_CHUNK). Fails with GE_NOMEM. */
int offload_init(eng_offload *o, eng_backend *be, long long n, long long chunk);
void offload_free(eng_offload *o);
/* One AdamW step over n elements (at most the n offload_init sized: a state may step in
 * pieces): master (n fp32), m, v (n fp32, or bf16 with m16) in host memory, updated in place; grad (n) fp32 in device memory
 * (already clipped); w_act (n) device act-typed weights, rewritten from the new master.
 * The op stream is ordered after the upload; returns 0 or the backend's error. The elements
 * whose new weight or second moment is not finite are added into o->bad. */
int offload_adamw(eng_offload *o, long long n, float *master, void *m, void *v, void *w_act, const float *grad, float lr,
                  float beta1, float beta2, float eps, float wd, int step);
/* Host memory for master / moments (n floats): 2 MiB pages where the kernel allows, zeroed by
 * the threads that will update each part (NUMA placement); free() it. NULL with GE_NOMEM. */
float *offload_host_alloc(long long n);
/* The same with only [from, n) zeroed (touched) here, for a state whose host part is the tail
 * of a whole vector's buffer: [0, from) costs no memory until something writes it. */
float *offload_host_alloc_from(long long n, long long from);
/* Gives the pages wholly inside [p, p + n) of such a buffer back to the kernel (they read as
 * zeros after). */
void offload_host_release(float *p, long long n);
#endif
