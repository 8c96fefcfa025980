/* moe_routes.c — the store's encoding of a rollout's MoE routes (contract in moe_routes.h). */
#include "daemon/moe_routes.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

#define ROUTES_MAGIC 0x72315233u /* "R3r1" */
#define ROUTES_NONE 0xffffu

/* ---------------------------------------------------------------- encode */

int moe_routes_encode(const eng_rollout_group *rg, const eng_group_result *out, int ng, int Lm, int k, void **blob, size_t *len) {
    *blob = NULL;
    *len = 0;
    size_t W = (size_t)Lm * k, words = 4, ids = 0;
    for (int i = 0; i < ng; i++) {
        if (!W || !out[i].prompt_routes) return 0;
        words += 2 + (size_t)out[i].n;
        ids += (size_t)rg[i].P * W;
        for (int r = 0; r < out[i].n; r++) {
            if (!out[i].resp[r].routes && out[i].resp[r].n_tokens) return 0;
            ids += (size_t)out[i].resp[r].n_tokens * W;
        }
    }
    size_t bytes = words * 4 + ids * 2;
    unsigned char *b = malloc(bytes);
    if (!b) return err_set(GE_NOMEM, "out of memory for %zu bytes of routes", bytes);
    uint32_t *h = (uint32_t *)b;
    *h++ = ROUTES_MAGIC, *h++ = (uint32_t)Lm, *h++ = (uint32_t)k, *h++ = (uint32_t)ng;
    for (int i = 0; i < ng; i++) {
        *h++ = (uint32_t)rg[i].P, *h++ = (uint32_t)out[i].n;
        for (int r = 0; r < out[i].n; r++) *h++ = (uint32_t)out[i].resp[r].n_tokens;
    }
    uint16_t *d = (uint16_t *)h;
    for (int i = 0; i < ng; i++)
        for (int r = -1; r < out[i].n; r++) {
            const int *src = r < 0 ? out[i].prompt_routes : out[i].resp[r].routes;
            size_t m = (r < 0 ? (size_t)rg[i].P : (size_t)out[i].resp[r].n_tokens) * W;
            for (size_t j = 0; j < m; j++) *d++ = src[j] < 0 ? ROUTES_NONE : (uint16_t)src[j];
        }
    *blob = b;
    *len = bytes;
    return 0;
}

/* ---------------------------------------------------------------- decode */

/* Reads the next u32 of blob at *off (0: none left). */
static int next_u32(const unsigned char *b, size_t len, size_t *off, uint32_t *v) {
    if (*off + 4 > len) return 0;
    memcpy(v, b + *off, 4);
    *off += 4;
    return 1;
}

int moe_routes_attach(const void *blob, size_t len, int Lm, int E, int k, eng_update_group *g, int n, moe_routes *rs) {
    memset(rs, 0, sizeof *rs);
    const unsigned char *b = blob;
    size_t off = 0, W = (size_t)Lm * k, ids = 0, nresp = 0;
    uint32_t v[4];
    for (int i = 0; i < 4; i++)
        if (!next_u32(b, len, &off, &v[i])) return err_set(GE_CONFLICT, "recorded routes: truncated header");
    if (v[0] != ROUTES_MAGIC || v[1] != (uint32_t)Lm || v[2] != (uint32_t)k || v[3] != (uint32_t)n)
        return err_set(GE_CONFLICT, "recorded routes are for %u groups of %u MoE layers x %u experts, not %d of %d x %d", v[3],
                       v[1], v[2], n, Lm, k);
    for (int i = 0; i < n; i++) {
        uint32_t P, N, R;
        if (!next_u32(b, len, &off, &P) || !next_u32(b, len, &off, &N) || P != (uint32_t)g[i].P || N != (uint32_t)g[i].n)
            return err_set(GE_CONFLICT, "recorded routes of group %d do not match its prompt or responses", i);
        ids += P * W;
        for (int r = 0; r < g[i].n; r++) {
            if (!next_u32(b, len, &off, &R) || R != (uint32_t)g[i].R[r])
                return err_set(GE_CONFLICT, "recorded routes of groups[%d].responses[%d] do not match its tokens", i, r);
            ids += R * W;
        }
        nresp += (size_t)g[i].n;
    }
    if (len - off != ids * 2) return err_set(GE_CONFLICT, "recorded routes: %zu bytes of ids, %zu expected", len - off, ids * 2);
    rs->ids = malloc((ids ? ids : 1) * sizeof(int));
    rs->resp = malloc((nresp ? nresp : 1) * sizeof *rs->resp);
    if (!rs->ids || !rs->resp) {
        moe_routes_free(rs);
        return err_set(GE_NOMEM, "out of memory for %zu routes", ids);
    }
    for (size_t j = 0; j < ids; j++) {
        uint16_t x;
        memcpy(&x, b + off + 2 * j, 2);
        rs->ids[j] = x == ROUTES_NONE ? -1 : x;
        if (x != ROUTES_NONE && x >= E) {
            moe_routes_free(rs);
            return err_set(GE_CONFLICT, "recorded routes name expert %u of a model of %d", x, E);
        }
    }
    const int *p = rs->ids, **rp = rs->resp;
    for (int i = 0; i < n; i++) {
        g[i].prompt_routes = p;
        p += (size_t)g[i].P * W;
        g[i].resp_routes = rp;
        for (int r = 0; r < g[i].n; r++) {
            *rp++ = p;
            p += (size_t)g[i].R[r] * W;
        }
    }
    return 0;
}

void moe_routes_free(moe_routes *rs) {
    free(rs->ids);
    free((void *)rs->resp);
    rs->ids = NULL;
    rs->resp = NULL;
}
