/* test_moe_routes.c — the store's encoding of a rollout's MoE routes (daemon/moe_routes.h):
 * random routes (-1s included) of ragged groups read back equal onto the update groups the
 * rollout's result makes; a blob that does not fit the groups or the model is a conflict, and a
 * rollout without routes (a dense model, a remote part) makes no blob. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "common/err.h"
#include "daemon/moe_routes.h"

enum { LM = 3, K = 2, E = 7, W = LM * K };

TEST(round_trip) {
    static const int P[2] = {5, 1}, N[2] = {3, 1}, R[2][3] = {{4, 1, 6}, {2}};
    eng_rollout_group rg[2];
    eng_group_result out[2];
    eng_update_group g[2];
    int *prompt[2], *resp_tok[2][3];
    const int *resp_ptr[2][3];
    unsigned long long s = 77;
    for (int i = 0; i < 2; i++) {
        prompt[i] = calloc((size_t)P[i], sizeof(int));
        rg[i] = (eng_rollout_group){prompt[i], P[i], N[i]};
        out[i] = (eng_group_result){.resp = calloc((size_t)N[i], sizeof(eng_response)), .n = N[i]};
        out[i].prompt_routes = malloc((size_t)P[i] * W * sizeof(int));
        for (int t = 0; t < P[i] * W; t++)
            out[i].prompt_routes[t] = (int)((check_randf(&s, 0.5f) + 0.5f) * (E + 1)) % (E + 1) - 1;
        for (int r = 0; r < N[i]; r++) {
            eng_response *o = &out[i].resp[r];
            o->n_tokens = R[i][r];
            o->routes = malloc((size_t)R[i][r] * W * sizeof(int));
            for (int t = 0; t < R[i][r] * W; t++) o->routes[t] = (int)((check_randf(&s, 0.5f) + 0.5f) * (E + 1)) % (E + 1) - 1;
            resp_tok[i][r] = calloc((size_t)R[i][r], sizeof(int));
            resp_ptr[i][r] = resp_tok[i][r];
        }
        g[i] = (eng_update_group){.prompt = prompt[i], .P = P[i], .n = N[i], .resp = resp_ptr[i], .R = R[i]};
    }
    void *blob;
    size_t len;
    CHECK(moe_routes_encode(rg, out, 2, LM, K, &blob, &len) == 0 && blob);
    moe_routes rs;
    CHECK_MSG(moe_routes_attach(blob, len, LM, E, K, g, 2, &rs) == 0, "%s", err_msg());
    for (int i = 0; i < 2; i++) {
        CHECK(!memcmp(g[i].prompt_routes, out[i].prompt_routes, (size_t)P[i] * W * sizeof(int)));
        for (int r = 0; r < N[i]; r++)
            CHECK(!memcmp(g[i].resp_routes[r], out[i].resp[r].routes, (size_t)R[i][r] * W * sizeof(int)));
    }
    moe_routes_free(&rs);
    /* another model, other groups, an expert past E, a cut blob: conflicts */
    CHECK(moe_routes_attach(blob, len, LM + 1, E, K, g, 2, &rs) == GE_CONFLICT);
    CHECK(moe_routes_attach(blob, len, LM, E, K, g, 1, &rs) == GE_CONFLICT);
    int R2[3] = {4, 2, 6};
    g[0].R = R2;
    CHECK(moe_routes_attach(blob, len, LM, E, K, g, 2, &rs) == GE_CONFLICT);
    CHECK_MSG(strstr(err_msg(), "groups[0].responses[1]"), "%s", err_msg());
    g[0].R = R[0];
    CHECK(moe_routes_attach(blob, len, LM, E - 1, K, g, 2, &rs) == GE_CONFLICT); /* the draws reach E - 1 */
    CHECK(moe_routes_attach(blob, len - 2, LM, E, K, g, 2, &rs) == GE_CONFLICT);
    free(blob);
    /* no routes: no blob */
    free(out[1].prompt_routes);
    out[1].prompt_routes = NULL;
    CHECK(moe_routes_encode(rg, out, 2, LM, K, &blob, &len) == 0 && !blob);
    for (int i = 0; i < 2; i++) {
        for (int r = 0; r < N[i]; r++) free(resp_tok[i][r]);
        eng_group_result_free(&out[i]);
        free(prompt[i]);
    }
}

int main(void) {
    RUN(round_trip);
    return CHECK_DONE();
}
