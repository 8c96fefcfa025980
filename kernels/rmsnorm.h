/* rmsnorm.h — RMSNorm as Llama/Qwen define it: y = w * x / sqrt(mean(x^2) + eps), with the
 * statistics in fp32. Also serves the per-head q/k norm of Qwen3 (rows = T*H, C = D).
 * Legend: T rows, C normalised width. */
#ifndef GRPOD_RMSNORM_H
#define GRPOD_RMSNORM_H
void rmsnorm_fwd_cpu(float *out, float *rstd, const float *inp, const float *w, int T, int C, float eps);
/* out (T,C), rstd (T) saved for backward = 1/sqrt(mean(x^2)+eps), inp (T,C), w (C) */
void rmsnorm_bwd_cpu(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                     const float *rstd, int T, int C);
/* dinp (T,C) += d/dx; dw (C) += d/dw. dinp may not alias dout. */
#endif
