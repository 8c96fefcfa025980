/* rope.h — rotary position embedding, Hugging Face "rotate_half" layout: the first and second
 * halves of each head are the two coordinates of D/2 rotations.
 *   y1 = x1 cos - x2 sin,  y2 = x2 cos + x1 sin,  angle = pos * inv_freq[i]  (fp32 product, as HF)
 * Backward is the inverse rotation (angle -> -angle).
 * Legend: T tokens, H heads (or kv heads), D head dim. */
#ifndef GRPOD_ROPE_H
#define GRPOD_ROPE_H
void rope_fwd_cpu(float *x, const int *pos, const float *inv_freq, int T, int H, int D);
/* x (T,H,D) rotated in place; pos (T); inv_freq (D/2) */
void rope_bwd_cpu(float *dx, const int *pos, const float *inv_freq, int T, int H, int D);
/* dx (T,H,D) in place: gradient w.r.t. the unrotated input */

/* inv_freq (D/2) for a model: theta^(-2i/D), then Llama 3 scaling when factor > 0
 * (low_freq_factor, high_freq_factor, original max positions), as transformers computes it. */
void rope_inv_freq(float *inv_freq, int D, float theta, float factor, float low_freq_factor,
                   float high_freq_factor, int original_max_pos);
#endif
