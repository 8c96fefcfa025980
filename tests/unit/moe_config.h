/* moe_config.h — the small random Qwen3-MoE the MoE tests share (test_moe.c, test_moe_ep.c):
 * three layers (MoE, dense, MoE), C 32, 4 heads of 8 (2 kv heads, q/k norm), F 48, V 61, top-2
 * of E experts of Fm 24. */
#ifndef GRPOD_TEST_MOE_CONFIG_H
#define GRPOD_TEST_MOE_CONFIG_H
#include "engine/format/config.h"

static inline model_config moe_test_config(int E, int norm_topk) {
    return (model_config){.arch = ARCH_QWEN3_MOE,
                          .arch_name = "qwen3_moe",
                          .L = 3,
                          .C = 32,
                          .H = 4,
                          .K = 2,
                          .D = 8,
                          .F = 48,
                          .V = 61,
                          .max_pos = 256,
                          .eps = 1e-6f,
                          .rope_theta = 10000.0f,
                          .qk_norm = 1,
                          .bos_id = -1,
                          .E = E,
                          .top_k = 2,
                          .Fm = 24,
                          .norm_topk = norm_topk,
                          .mlp = {MLP_MOE, MLP_DENSE, MLP_MOE}};
}
#endif
