/* moe_shared.h — the gate of a shared expert (Qwen3.5-MoE's Qwen3_5MoeSparseMoeBlock): every
 * token runs one more SwiGLU expert y (engine/model/model.c composes it from matmul.h and
 * swiglu.h), scaled by a gate of its own, z = x · g (shared_expert_gate, one output):
 *
 *   out += sigmoid(z_t) y_t          per token t, broadcast over the C channels
 *
 * Legend: T tokens, C model dim. */
#ifndef GRPOD_MOE_SHARED_H
#define GRPOD_MOE_SHARED_H
void moe_shared_gate_fwd_cpu(float *out, const float *y, const float *z, int T, int C);
/* out (T,C) +=; y (T,C) the shared expert's output; z (T) its gate's logits */
void moe_shared_gate_bwd_cpu(float *y, float *z, const float *dout, int T, int C);
/* in place, row by row: z_t := sigmoid'(z_t) Σ_c dout_tc y_tc (d z), then y_t := sigmoid(z_t)
 * dout_t (d y); dout (T,C) */
#endif
