/* bf16.h — bfloat16 on the host: its bits from fp32 and back. One definition for every floor
 * (the host AdamW, the safetensors reader and writer, the cpu comm's bf16 sums), because replay
 * and the ranks' bit-equality depend on all of them rounding alike.
 *   bf16_from_f32: round to nearest, ties to even (as __float2bfloat16 does); a NaN stays a
 *   quiet NaN. Written as a select, so loops over it vectorize.
 *   f32_from_bf16: exact. */
#ifndef GRPOD_BF16_H
#define GRPOD_BF16_H
#include <stdint.h>

static inline uint16_t bf16_from_f32(float f) {
    union {
        float f;
        uint32_t u;
    } x = {f};
    uint32_t rne = (x.u + 0x7fffu + ((x.u >> 16) & 1u)) >> 16, nan = (x.u >> 16) | 0x40u;
    return (uint16_t)((x.u & 0x7fffffffu) > 0x7f800000u ? nan : rne);
}
static inline float f32_from_bf16(uint16_t h) {
    union {
        uint32_t u;
        float f;
    } x = {(uint32_t)h << 16};
    return x.f;
}
#endif
