/* moe_routes.h — a rollout's MoE routes as the store keeps them (store_routes_put/get), for routing
 * replay (engine.h eng_response.routes, eng_update_group's routes; kernels/moe.h).
 *
 * One blob per rollout job, never in its JSON result (at 30B-A3B dims one 512-token response is
 * 48 layers x 8 experts x 512 ids). Layout, little-endian as the host writes it:
 *   u32 magic "R3r1", u32 Lm (MoE layers), u32 k (experts per token), u32 G (groups);
 *   per group: u32 P, u32 N, N x u32 R_i;
 *   then per group the prompt's P x Lm x k ids, then each response's R_i x Lm x k, as u16
 *   (0xffff: none recorded, the trainer routes the token itself).
 * Engine thread only; the caller owns what it passes and frees what it gets. */
#ifndef GRPOD_DAEMON_MOE_ROUTES_H
#define GRPOD_DAEMON_MOE_ROUTES_H
#include <stddef.h>

#include "engine/engine.h"

/* The blob of ng groups' results (rg: their prompts), Lm MoE layers of k experts (eng_info).
 * 0 with *blob NULL when some group has no routes (a dense model, or a part that came back
 * from a remote rank without them); GE_NOMEM. */
int moe_routes_encode(const eng_rollout_group *rg, const eng_group_result *out, int ng, int Lm, int k, void **blob, size_t *len);

/* Decoded routes that update groups point into (moe_routes_attach); free with moe_routes_free. */
typedef struct {
    int *ids; /* every token's, as int (-1: none) */
    const int **resp; /* the response pointers of all groups */
} moe_routes;
/* Points g[i].prompt_routes / resp_routes (n groups, the rollout's in its order) into *rs made
 * from blob, for a model of Lm MoE layers, E experts, k per token. GE_CONFLICT when the blob
 * does not fit the groups or the model (another model's rollout, a corrupt blob). */
int moe_routes_attach(const void *blob, size_t len, int Lm, int E, int k, eng_update_group *g, int n, moe_routes *rs);
void moe_routes_free(moe_routes *rs);
#endif
