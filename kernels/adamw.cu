/* adamw.cu — fused AdamW on fp32 master weights writing the bf16 copy the model reads in the
 * same pass; element math and host scalars exactly as adamw_cpu (adamw.h: torch's eager kernel,
 * scalars recovered as the decimals the user wrote); the squared-norm reduction for grad
 * clipping (fp32 per thread, double across blocks, so not bit-identical to sumsq_cpu; the
 * blocks' partials are summed on the host in block order, never by atomics, so the same
 * gradient gives the same norm on every run — replay depends on it); scale. */
#include <math.h>

#include "kernels/adamw.cuh"

__global__ void adamw_kernel(float *p, bf16 *act, const float *g, float *m, float *v, long long n, float decay, float w1,
                             float w2, float b2f, float step_size, float bc2_sqrt, float eps_f) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        float gi = g[i], mi = m[i], vi = v[i];
        float pi = p[i] * decay;
        mi = mi + w1 * (gi - mi);
        vi = vi * b2f + w2 * gi * gi;
        float denom = sqrtf(vi) / bc2_sqrt + eps_f;
        pi = pi - step_size * (mi / denom);
        p[i] = pi;
        m[i] = mi;
        v[i] = vi;
        if (act) act[i] = __float2bfloat16(pi);
    }
}

__global__ void sumsq_kernel(double *out, const float *x, long long n) {
    __shared__ float sh[32];
    float s = 0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        s += x[i] * x[i];
    s = block_sum(s, sh);
    if (threadIdx.x == 0) out[blockIdx.x] = (double)s;
}

__global__ void scale_kernel(float *x, long long n, float s) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) x[i] *= s;
}

static unsigned grid_for(cu_ctx *c, long long n) {
    unsigned b = cu_blocks(n, 256), cap = (unsigned)c->n_sm * 8;
    return b < cap ? b : cap;
}

void adamw_cuda(cu_ctx *c, float *master, bf16 *act_copy, const float *g, float *m, float *v, long long n, float lr, float beta1,
                float beta2, float eps, float wd, int step) {
    if (c->failed || n <= 0) return;
    const double lr_d = adamw_scalar(lr), b1_d = adamw_scalar(beta1), b2_d = adamw_scalar(beta2);
    const double bc1 = 1.0 - pow(b1_d, step), bc2 = 1.0 - pow(b2_d, step);
    const float decay = (float)(1.0 - lr_d * adamw_scalar(wd));
    const float w1 = (float)(1.0 - b1_d), w2 = (float)(1.0 - b2_d), b2f = (float)b2_d;
    const float step_size = (float)(lr_d / bc1), bc2_sqrt = (float)sqrt(bc2), eps_f = (float)adamw_scalar(eps);
    adamw_kernel<<<grid_for(c, n), 256, 0, c->stream>>>(master, act_copy, g, m, v, n, decay, w1, w2, b2f, step_size, bc2_sqrt,
                                                        eps_f);
    CU_LAUNCHED(c, "adamw_kernel");
}

double sumsq_cuda(cu_ctx *c, const float *x, long long n) {
    /* on the caller's stack: the ranks of one process (daemon --gpus) call this at once; a
     * static buffer shared by them once mixed their partial sums into a wrong gradient norm */
    double part[CU_RED_SLOTS];
    if (c->failed || n <= 0) return 0;
    unsigned nb = grid_for(c, n);
    if (nb > CU_RED_SLOTS) nb = CU_RED_SLOTS;
    sumsq_kernel<<<nb, 256, 0, c->stream>>>(c->red, x, n);
    CU_LAUNCHED(c, "sumsq_kernel");
    CU_CK(c, cudaMemcpyAsync(part, c->red, nb * sizeof(double), cudaMemcpyDeviceToHost, c->stream));
    CU_CK(c, cudaStreamSynchronize(c->stream));
    double r = 0;
    for (unsigned b = 0; b < nb; b++) r += part[b];
    return c->failed ? 0 : r;
}

void scale_cuda(cu_ctx *c, float *x, long long n, float s) {
    if (c->failed || n <= 0) return;
    scale_kernel<<<grid_for(c, n), 256, 0, c->stream>>>(x, n, s);
    CU_LAUNCHED(c, "scale_kernel");
}
