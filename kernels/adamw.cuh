/* adamw.cuh — the CUDA launchers of adamw.cu: AdamW (PyTorch's decoupled weight decay)
 * on the fp32 master, writing act_copy (bf16) when not NULL; sumsq blocks and returns sum(x^2)
 * in double (the one launcher that waits). Legend: n elements.
 * Same arguments as the adamw.h reference with a `_cuda` suffix and a cu_ctx first; bf16 where the
 * CPU has fp32 activations/weights. Launchers enqueue on ctx->stream and never block. */
#ifndef GRPOD_KERNELS_ADAMW_CUH
#define GRPOD_KERNELS_ADAMW_CUH
#include "kernels/common.cuh"
#include "kernels/adamw.h"

void adamw_cuda(cu_ctx *c, float *master, bf16 *act_copy, const float *g, float *m, float *v, long long n, float lr, float beta1,
                float beta2, float eps, float wd, int step);
double sumsq_cuda(cu_ctx *c, const float *x, long long n);
void scale_cuda(cu_ctx *c, float *x, long long n, float s);
#endif
