/* deltanet_decode.h — the gated DeltaNet's conv and rule one token at a time against state rows
 * that outlive the forward (rollout decode and prefill; engine/rollout/). Same functions as
 * deltanet.h's conv and rule, but where the training ops find a token's history through the
 * packed layout's ranges, these read and update a sequence's own row in place:
 *
 *   tail  (S, Kc-1, Cc) fp32: a sequence's last Kc-1 conv inputs, oldest first (zeros: none yet)
 *   state (S, Hv, Dk, Dv) fp32: its recurrent state after its last token (zeros: none yet)
 *
 * Token t continues row srow[t] (< 0: none; the token is skipped, its outputs left unwritten:
 * a CUDA graph's padding). The tokens of one row are contiguous in a call and in order
 * (a prefilled prompt is a run of tokens, a decode step one token per row): each run is walked
 * token by token, runs in parallel (on CUDA a CTA per run and channel block / value head).
 * A fresh row of zeros gives the bits of the training ops' "no history" (deltanet_cpu.h), and the
 * same fp32 operations in the same order, so on the CPU a decoded token's output equals the
 * training forward's bit for bit.
 * Legend as deltanet.h: T tokens, S state rows, Hk, Hv, Dk, Dv, Kc, Cc = 2 Hk Dk + Hv Dv. */
#ifndef GRPOD_DELTANET_DECODE_H
#define GRPOD_DELTANET_DECODE_H

void deltanet_conv_step_cpu(float *u, float *tail, const float *x, const float *w, const int *srow, int T, int Cc, int Kc);
/* u, x (T,Cc); w (Cc,Kc); tail (S,Kc-1,Cc) rows srow[t] read and shifted in place */
void deltanet_rule_step_cpu(float *o, float *state, const float *u, const float *a, const float *b, const float *A_log,
                            const float *dt_bias, const int *srow, int T, int Hk, int Hv, int Dk, int Dv);
/* o (T,Hv,Dv) written; u (T,Cc); a, b (T,Hv); A_log, dt_bias (Hv); state (S,Hv,Dk,Dv) rows
 * srow[t] updated in place */

/* 1 when token t starts a run (its row differs from token t-1's) */
static inline int deltanet_run_start(const int *srow, int t) { return t == 0 || srow[t - 1] != srow[t]; }
#endif
