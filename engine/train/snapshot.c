/* snapshot.c — the update's safety copy (snapshot.h). */
#include "engine/train/snapshot.h"

#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/err.h"
#include "engine/engine_internal.h"
#include "engine/train/state.h"

/* SNAP_PINNED's pieces: the copy engines work through their queues in order, so a pass's own
 * uploads and downloads on the op stream wait behind at most one piece (~0.3 ms over PCIe 5) */
#define SNAP_PIECE ((size_t)16 << 20)

const char *snap_where_name(int where) {
    static const char *const names[] = {"none", "device", "pinned", "host"};
    return where >= 0 && where <= SNAP_HOST ? names[where] : "none";
}

/* The three arrays the copy covers, in buf's order. */
static void state_arrays(eng *e, void *a[3]) {
    a[0] = eng_train_master(e);
    a[1] = e->adam_m;
    a[2] = e->adam_v;
}
/* Where array i starts in buf. */
static size_t buf_at(const snap_state *s, int i) { return i == 0 ? 0 : i == 1 ? s->sz[0] : s->sz[0] + s->sz[1]; }

int snap_alloc(eng *e, int where) {
    snap_state *s = &e->snap;
    eng_backend *be = e->be;
    size_t n = (size_t)eng_state_n(e);
    s->sz[0] = n * 4;
    s->sz[1] = s->sz[2] = n * (size_t)(state_elem_bytes(e) - 4) / 2;
    s->where = where;
    size_t bytes = s->sz[0] + s->sz[1] + s->sz[2];
    if (where == SNAP_DEVICE) s->buf = be->alloc(be, bytes);
    else if (where == SNAP_PINNED) s->buf = be->host_alloc ? be->host_alloc(be, bytes) : NULL;
    else if (where == SNAP_HOST) s->buf = malloc(bytes);
    else return 0;
    if (!s->buf) {
        s->where = SNAP_NONE;
        return err_set(GE_NOMEM, "the update's safety copy (%zu MiB of %s memory) does not fit", bytes >> 20,
                       snap_where_name(where));
    }
    return 0;
}

/* The host copy in 64 pieces an array, over the OpenMP threads (one thread copies ~10 GB/s; the
 * state at 8B dims is ~100 GB). */
static void host_copy(const snap_state *s, const void *const src[3]) {
    enum { PIECES = 64 };
#pragma omp parallel for schedule(dynamic)
    for (int k = 0; k < 3 * PIECES; k++) {
        int i = k / PIECES;
        size_t n = s->sz[i], step = (n + PIECES - 1) / PIECES, a = (size_t)(k % PIECES) * step, b = a + step < n ? a + step : n;
        if (a < b) memcpy(s->buf + buf_at(s, i) + a, (const char *)src[i] + a, b - a);
    }
}

static void *copy_thread(void *arg) {
    snap_state *s = arg;
    host_copy(s, s->src);
    return NULL;
}

/* SNAP_PINNED: one piece at a time on the snapshot lane, the next queued when the last is done.
 * Queued all at once, the pieces would hold a copy engine for the whole copy (~0.7 s for 37 GB)
 * and every copy the passes make would wait for all of it. */
static void *pinned_thread(void *arg) {
    snap_state *s = arg;
    eng_backend *be = s->be;
    int rc = 0;
    for (int i = 0; i < 3 && !rc; i++)
        for (size_t o = 0, n = s->sz[i]; o < n && !rc; o += SNAP_PIECE) {
            rc = be->copy_async(be, BE_LANE_SNAP, s->buf + buf_at(s, i) + o, (const char *)s->src[i] + o,
                                n - o < SNAP_PIECE ? n - o : SNAP_PIECE);
            if (!rc) be->mark(be, BE_LANE_SNAP, BE_EV_SNAP);
            if (!rc) rc = be->wait(be, BE_LANE_HOST, BE_EV_SNAP);
        }
    s->rc = rc;
    return NULL;
}

int snap_begin(eng *e) {
    snap_state *s = &e->snap;
    eng_backend *be = e->be;
    s->ok = 0;
    if (s->where == SNAP_NONE || s->busy) return 0;
    void *a[3];
    state_arrays(e, a);
    s->opt_step = e->opt_step;
    s->version = e->policy_version;
    s->busy = 1;
    s->thread = 0;
    for (int i = 0; i < 3; i++) s->src[i] = a[i];
    if (s->where == SNAP_HOST) {
        /* host state: a helper thread where the engine thread then waits on the GPU, else in snap_wait */
        if (!be->copy_async) return 0;
        if (pthread_create(&s->th, NULL, copy_thread, s)) return 0; /* snap_wait copies instead */
        s->thread = 1;
        return 0;
    }
    /* device state, after the ops that made it: pinned pieces fed by a helper thread (which owns
     * the snapshot lane and BE_EV_SNAP meanwhile), else queued on the snapshot lane at once. Nothing
     * may wait for the whole device meanwhile: the update reserves its activations before it
     * begins the copy (cudaFree waits for every stream). */
    int rc = be->sync(be);
    s->be = be;
    s->rc = 0;
    if (!rc && s->where == SNAP_PINNED && !pthread_create(&s->th, NULL, pinned_thread, s)) {
        s->thread = 1;
        return 0;
    }
    for (int i = 0; i < 3 && !rc; i++)
        for (size_t o = 0, n = s->sz[i]; o < n && !rc; o += SNAP_PIECE)
            rc = be->copy_async(be, BE_LANE_SNAP, s->buf + buf_at(s, i) + o, (char *)a[i] + o,
                                n - o < SNAP_PIECE ? n - o : SNAP_PIECE);
    if (!rc) be->mark(be, BE_LANE_SNAP, BE_EV_SNAP);
    return rc;
}

int snap_wait(eng *e) {
    snap_state *s = &e->snap;
    eng_backend *be = e->be;
    if (!s->busy) return 0;
    double t = clock_mono_ms();
    int rc = 0;
    if (s->thread) {
        pthread_join(s->th, NULL);
        rc = s->rc;
    } else if (s->where == SNAP_HOST) {
        void *a[3];
        state_arrays(e, a);
        host_copy(s, (const void *const *)a);
    } else rc = be->wait(be, BE_LANE_HOST, BE_EV_SNAP);
    s->busy = s->thread = 0;
    s->ms_wait = clock_mono_ms() - t;
    return rc;
}

int snap_restore(eng *e) {
    snap_state *s = &e->snap;
    eng_backend *be = e->be;
    s->ok = 0;
    if (s->where == SNAP_NONE)
        return err_set(GE_STATE_LOST,
                       "the training state changed and there is no safety copy to restore it from "
                       "(the memory plan found no room for one): restart to recover by replay");
    int rc = snap_wait(e);
    void *a[3];
    state_arrays(e, a);
    for (int i = 0; i < 3 && !rc; i++) {
        char *b = s->buf + buf_at(s, i);
        size_t n = s->sz[i];
        rc = s->where == SNAP_HOST    ? (memcpy(a[i], b, n), 0)
            : s->where == SNAP_PINNED ? be->to_dev(be, a[i], b, n)
                                      : be->copy_async(be, BE_LANE_OPS, a[i], b, n);
    }
    rc = state_act_from_master(e, rc);
    e->opt_step = s->opt_step;
    e->policy_version = s->version;
    return rc;
}

void snap_free(eng *e) {
    snap_state *s = &e->snap;
    if (s->busy) snap_wait(e);
    if (s->buf) {
        if (s->where == SNAP_DEVICE) e->be->free(e->be, s->buf);
        else if (s->where == SNAP_PINNED) e->be->host_free(e->be, s->buf);
        else free(s->buf);
    }
    memset(s, 0, sizeof *s);
}
