/* swiglu.h — the gated MLP activation of Llama/Qwen: out = silu(gate) * up,
 * silu(x) = x * sigmoid(x). The three projections around it are matmul.h (the gate/up side
 * with this activation fused: mlp_in_fwd).
 * Legend: T tokens, F MLP dim (n = T*F elements). */
#ifndef GRPOD_SWIGLU_H
#define GRPOD_SWIGLU_H
void swiglu_fwd_cpu(float *out, const float *gate, const float *up, long long n);
/* out, gate, up (T,F) */
void swiglu_bwd_cpu(float *dgate, float *dup, const float *dout, const float *gate, const float *up, long long n);
/* dgate, dup (T,F) overwritten; dgate may alias dout (each element's dout is read before its
 * dgate is written; the model shares the two buffers) */
#endif
