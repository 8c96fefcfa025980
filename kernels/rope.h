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
/* The model's inv_freq table (rope_inv_freq) is computed from its config: engine/format/config.h. */
#endif
