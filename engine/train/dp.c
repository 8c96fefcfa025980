/* dp.c — the data-parallel pieces of the engine that update.c and checkpoint.c use
 * when the engine has a comm (of W ranks; also of one, where every collective is the identity):
 *
 *   placement   eng_place_groups: whole groups to ranks, balanced by a weight (packed tokens for
 *               the update; the daemon may pass KV rows for rollouts). Largest first to the least
 *               loaded rank; ties to the lower index and the lower rank: a pure function of the
 *               weights, so every rank computes the same placement without talking.
 *   shards      the trainable vector (n elements) is cut into W shards of S = ceil(n / W),
 *               rank r owning [r S, r S + S); the last shard's tail past n is padding, kept
 *               zero (its gradient is zero, so AdamW leaves it zero). The act weights and the
 *               gradient are held padded to W S on every rank; the fp32 master and the AdamW
 *               moments only for the shard (S each): 12 n / W bytes of optimizer state a rank.
 *   exchanges   small host values every rank must agree on (an error, a sum of squares, the loss
 *               metrics) go through one all-gather of bytes and are combined in rank order on
 *               each rank: the same bits everywhere.
 *   gathers     a sharded fp32 vector to rank 0's host memory in chunks (checkpoints).
 * Nothing here runs without a comm. Only the engine thread calls these. */
#define _GNU_SOURCE /* qsort_r */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "engine/engine_internal.h"

/* ---------------------------------------------------------------- placement */

static int by_weight_desc(const void *a, const void *b, void *ud) {
    const long long *w = ud;
    int i = *(const int *)a, j = *(const int *)b;
    if (w[i] != w[j]) return w[i] > w[j] ? -1 : 1;
    return i - j;
}

void eng_place_groups(const long long *weight, int n, int W, int *rank) {
    if (W <= 1) {
        for (int i = 0; i < n; i++) rank[i] = 0;
        return;
    }
    int *ord = malloc((size_t)(n ? n : 1) * sizeof(int));
    long long *load = calloc((size_t)W, sizeof(long long));
    if (!ord || !load) { /* round robin: still deterministic */
        for (int i = 0; i < n; i++) rank[i] = i % W;
        free(ord);
        free(load);
        return;
    }
    for (int i = 0; i < n; i++) ord[i] = i;
    qsort_r(ord, (size_t)n, sizeof(int), by_weight_desc, (void *)weight);
    for (int k = 0; k < n; k++) {
        int best = 0;
        for (int q = 1; q < W; q++)
            if (load[q] < load[best]) best = q;
        rank[ord[k]] = best;
        load[best] += weight[ord[k]];
    }
    free(ord);
    free(load);
}

/* ---------------------------------------------------------------- exchanges */

#define DP_BUF_BYTES 65536

static int is_host(const eng *e) { return !strcmp(e->be->name, "cpu"); }

int dp_exchange(eng *e, const void *mine, void *all, size_t bytes) {
    eng_backend *be = e->be;
    if (is_host(e)) return comm_all_gather(e->comm, mine, all, bytes, COMM_U8);
    if ((size_t)(e->W + 1) * bytes > DP_BUF_BYTES) return err_set(GE_INTERNAL, "dp: exchange of %zu bytes a rank", bytes);
    char *in = (char *)e->dp_buf + (size_t)e->W * bytes; /* dp_buf: made by eng_open (dp_open) */
    int rc = be->to_dev(be, in, mine, bytes);
    /* a rank that cannot take part aborts the group: the others' collective returns GE_COMM
     * instead of waiting for it forever */
    if (rc) {
        comm_abort(e->comm);
        return rc;
    }
    rc = comm_all_gather(e->comm, in, e->dp_buf, bytes, COMM_U8);
    if (!rc) rc = be->to_host(be, all, e->dp_buf, (size_t)e->W * bytes);
    return rc;
}

int dp_agree(eng *e, int rc) {
    if (!e->dp) return rc;
    int *all = malloc((size_t)e->W * sizeof(int));
    if (!all) return err_set(GE_NOMEM, "dp: out of memory");
    char msg[512];
    snprintf(msg, sizeof msg, "%s", rc ? err_msg() : "");
    int xrc = dp_exchange(e, &rc, all, sizeof(int));
    int first = -1;
    for (int q = 0; !xrc && q < e->W && first < 0; q++)
        if (all[q]) first = q;
    int code = first >= 0 ? all[first] : 0;
    free(all);
    if (xrc) return rc ? err_set(rc, "%s", msg) : xrc;
    if (rc) return err_set(rc, "%s", msg); /* this rank's own failure, message kept */
    if (first >= 0) return err_set(code, "rank %d of %d failed (%s); this rank stopped with it", first, e->W, err_name(code));
    return 0;
}

int dp_sum(eng *e, double x, double *sum) {
    double *all = malloc((size_t)e->W * sizeof(double));
    if (!all) return err_set(GE_NOMEM, "dp: out of memory");
    int rc = dp_exchange(e, &x, all, sizeof x);
    double s = 0;
    for (int q = 0; !rc && q < e->W; q++) s += all[q]; /* rank order: the same bits on every rank */
    free(all);
    *sum = s;
    return rc;
}

/* ---------------------------------------------------------------- gathers */

int dp_open(eng *e) {
    if (is_host(e)) return 0;
    return (e->dp_buf = e->be->alloc(e->be, DP_BUF_BYTES)) ? 0 : GE_NOMEM;
}

int dp_gather_to_host(eng *e, const float *shard, float *host) {
    eng_backend *be = e->be;
    long long S = e->sh_n, C = S < (1LL << 22) ? S : (1LL << 22);
    /* an offloaded shard is host memory: staged through the device (not on cpu, whose memory is the host's) */
    int stage = e->offload && !is_host(e);
    float *tmp = be->alloc(be, (size_t)(e->W + stage) * (size_t)C * 4), *in = tmp + (size_t)e->W * (size_t)C;
    int rc = dp_agree(e, tmp ? 0 : GE_NOMEM);
    if (rc) {
        if (tmp) be->free(be, tmp);
        return rc;
    }
    for (long long j = 0; j < S && !rc; j += C) {
        long long c = S - j < C ? S - j : C;
        rc = dp_agree(e, stage ? be->to_dev(be, in, shard + j, (size_t)c * 4) : 0);
        if (!rc) rc = comm_all_gather(e->comm, stage ? in : shard + j, tmp, (size_t)c, COMM_F32);
        for (int q = 0; !rc && host && q < e->W; q++)
            rc = be->to_host(be, host + (size_t)q * (size_t)S + (size_t)j, tmp + (size_t)q * (size_t)c, (size_t)c * 4);
    }
    be->free(be, tmp);
    return rc;
}

int dp_gather_act(eng *e) {
    eng_backend *be = e->be;
    size_t eb = (size_t)be->act_bytes;
    char *act = eng_train_act(e);
    return comm_all_gather(e->comm, act + (size_t)e->sh_off * eb, act, (size_t)e->sh_n, eb == 4 ? COMM_F32 : COMM_BF16);
}
