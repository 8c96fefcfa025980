/* wait.c — what a handler borrows and waits on: store handles from a small pool (one SQLite
 * connection each, reused across requests) and long-polls, a connection suspended until a job
 * changes state (api_jobs_changed) or its deadline passes (api_tick). See internal.h. */
#include "api/internal.h"

#include <stdlib.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"

/* ---------------------------------------------------------------- store-handle pool */

store *api_pool_get(api_server *s) {
    store *st = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->n_pool > 0) st = s->pool[--s->n_pool];
    pthread_mutex_unlock(&s->mu);
    if (!st && store_open(s->data_dir, 0, &st)) {
        log_event(LOG_ERROR, "store_open_failed", "\"error\":\"%s\"", err_name(err_code()));
        return NULL;
    }
    return st;
}

void api_pool_put(api_server *s, store *st) {
    if (!st) return;
    pthread_mutex_lock(&s->mu);
    if (s->n_pool < API_POOL_MAX) {
        s->pool[s->n_pool++] = st;
        st = NULL;
    }
    pthread_mutex_unlock(&s->mu);
    store_close(st);
}

/* ---------------------------------------------------------------- long-poll waiters */

struct api_waiter {
    struct MHD_Connection *conn;
    double deadline;
    struct api_waiter *next;
};

/* Called with the job not finished: suspend until api_jobs_changed or the deadline. The
 * status is re-read under wmu so that a change between the caller's read and the suspend
 * cannot be missed (api_jobs_changed takes wmu after the store commit). */
int api_wait_suspend(api_server *s, struct MHD_Connection *c, api_req *x, store *st, const char *id) {
    pthread_mutex_lock(&s->wmu);
    store_job j = {0};
    int rc = store_get(st, id, &j);
    int terminal = rc || (j.status != JOB_QUEUED && j.status != JOB_RUNNING);
    store_job_clear(&j);
    if (terminal || atomic_load(&s->stopping) || clock_mono_s() >= x->deadline) {
        pthread_mutex_unlock(&s->wmu);
        return 0;
    }
    struct api_waiter *w = malloc(sizeof *w);
    if (!w) {
        pthread_mutex_unlock(&s->wmu);
        return 0;
    }
    w->conn = c;
    w->deadline = x->deadline;
    w->next = s->waiters;
    s->waiters = w;
    x->waiting = 1;
    MHD_suspend_connection(c);
    pthread_mutex_unlock(&s->wmu);
    return 1;
}

void api_resume_waiters(api_server *s, int all) {
    double t = clock_mono_s();
    pthread_mutex_lock(&s->wmu);
    for (struct api_waiter **pw = &s->waiters; *pw;) {
        struct api_waiter *w = *pw;
        if (all || t >= w->deadline) {
            MHD_resume_connection(w->conn);
            *pw = w->next;
            free(w);
        } else {
            pw = &w->next;
        }
    }
    pthread_mutex_unlock(&s->wmu);
    if (all) api_taps_changed(s); /* stopping: a streaming reply ends */
}

void api_jobs_changed(api_server *s) {
    if (!s) return;
    api_resume_waiters(s, 1); /* and the taps */
}

void api_tick(api_server *s) {
    if (!s) return;
    api_resume_waiters(s, 0);
    api_conns_sweep(s->conns, 0);
}
