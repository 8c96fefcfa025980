/* tap.c — token taps: the tokens of a rollout job as the scheduler samples them, handed from the
 * worker (engine thread) to a streaming reply (an HTTP thread) without the store.
 *
 * A streaming reply opens a tap on its job (api_tap_open) and reads it from its content reader
 * (api_tap_poll): when nothing is new the poll suspends the connection, and the worker's next
 * api_tap_wake (tokens arrived) or api_jobs_changed (a job ended) resumes it. The worker copies a
 * response's tokens past what the tap holds (api_tap_put) only for jobs someone taps
 * (api_tap_wanted), so rollouts that nobody streams cost one list walk per step. A tap is opened
 * with `changed` set: a job that ended before the tap existed is found in the store at the first
 * poll. What the worker puts is a prefix of the response (the final result in the store is the
 * truth: the last step's tokens may only be there).
 *
 * Threading: every call takes s->tmu; the connection is suspended and resumed under it, so a
 * wake-up between a poll's look and its suspend cannot be missed (as wait.c does for long-polls).
 * The tap is freed only by api_tap_close, after which the worker never touches its connection. */
#include "api/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int *tok; /* (len) */
    float *lp; /* (len) */
    int *top_ids; /* (len, k) with sampling.top_logprobs k, else NULL */
    float *top_lps;
    int len, cap, taken, k; /* taken: handed to the reader */
} tap_choice;

struct api_tap {
    char job_id[32];
    int n_groups, n; /* choice c = group * n + response */
    tap_choice *ch; /* (n_groups * n) */
    int fresh; /* tokens put since the last poll */
    int changed; /* some job changed state since the last poll */
    int suspended;
    int oom; /* a put could not grow its arrays: the reader falls back to the store */
    struct MHD_Connection *conn;
    api_tap *next;
};

/* ---------------------------------------------------------------- under tmu */

static api_tap *find(api_server *s, const char *job_id) {
    for (api_tap *t = s->taps; t; t = t->next)
        if (!strcmp(t->job_id, job_id)) return t;
    return NULL;
}

static void resume(api_tap *t) {
    if (!t->suspended) return;
    t->suspended = 0;
    MHD_resume_connection(t->conn);
}

/* ---------------------------------------------------------------- the reader's side */

api_tap *api_tap_open(api_server *s, const char *job_id, int n_groups, int n, struct MHD_Connection *c) {
    api_tap *t = calloc(1, sizeof *t);
    if (!t || !(t->ch = calloc((size_t)n_groups * (size_t)n, sizeof *t->ch))) {
        free(t);
        return NULL;
    }
    snprintf(t->job_id, sizeof t->job_id, "%s", job_id);
    t->n_groups = n_groups;
    t->n = n;
    t->changed = 1;
    t->conn = c;
    pthread_mutex_lock(&s->tmu);
    t->next = s->taps;
    s->taps = t;
    pthread_mutex_unlock(&s->tmu);
    return t;
}

void api_tap_close(api_server *s, api_tap *t) {
    if (!t) return;
    pthread_mutex_lock(&s->tmu);
    for (api_tap **pp = &s->taps; *pp; pp = &(*pp)->next)
        if (*pp == t) {
            *pp = t->next;
            break;
        }
    pthread_mutex_unlock(&s->tmu);
    for (int c = 0; c < t->n_groups * t->n; c++) {
        free(t->ch[c].tok);
        free(t->ch[c].lp);
        free(t->ch[c].top_ids);
        free(t->ch[c].top_lps);
    }
    free(t->ch);
    free(t);
}

int api_tap_poll(api_server *s, api_tap *t, api_tap_cb cb, void *ud) {
    pthread_mutex_lock(&s->tmu);
    if (!t->fresh && !t->changed && !atomic_load(&s->stopping)) {
        t->suspended = 1;
        MHD_suspend_connection(t->conn);
        pthread_mutex_unlock(&s->tmu);
        return 0;
    }
    int ret = API_TAP_TOKENS | (t->changed || t->oom ? API_TAP_CHANGED : 0);
    t->fresh = t->changed = 0;
    for (int c = 0; c < t->n_groups * t->n; c++) {
        tap_choice *h = &t->ch[c];
        if (h->len > h->taken) { /* only then are the arrays there (no offset on NULL) */
            size_t at = (size_t)h->taken * h->k;
            api_tokens x = {h->tok + h->taken,
                            h->lp + h->taken,
                            h->k ? h->top_ids + at : NULL,
                            h->k ? h->top_lps + at : NULL,
                            h->len - h->taken,
                            h->k};
            cb(ud, c, &x);
        }
        h->taken = h->len;
    }
    pthread_mutex_unlock(&s->tmu);
    return ret;
}

/* ---------------------------------------------------------------- the worker's side */

int api_tap_wanted(api_server *s, const char *job_id) {
    if (!s) return 0;
    pthread_mutex_lock(&s->tmu);
    int yes = s->taps && find(s, job_id);
    pthread_mutex_unlock(&s->tmu);
    return yes;
}

/* Room for cap tokens (k alternatives each) in h: 0, or -1 when out of memory. */
static int grow_choice(tap_choice *h, int cap, int k) {
    int *nt = realloc(h->tok, sizeof *nt * (size_t)cap);
    if (nt) h->tok = nt;
    float *nl = nt ? realloc(h->lp, sizeof *nl * (size_t)cap) : NULL;
    if (nl) h->lp = nl;
    if (!nl) return -1;
    if (k) {
        int *ti = realloc(h->top_ids, sizeof *ti * (size_t)cap * k);
        if (ti) h->top_ids = ti;
        float *tl = ti ? realloc(h->top_lps, sizeof *tl * (size_t)cap * k) : NULL;
        if (!tl) return -1;
        h->top_lps = tl;
    }
    h->cap = cap;
    h->k = k;
    return 0;
}

void api_tap_put(api_server *s, const char *job_id, int group, int resp, const api_tokens *x) {
    if (!s) return;
    pthread_mutex_lock(&s->tmu);
    api_tap *t = find(s, job_id);
    if (t && group >= 0 && group < t->n_groups && resp >= 0 && resp < t->n) {
        tap_choice *h = &t->ch[group * t->n + resp];
        int n = x->n, k = h->len ? h->k : x->k; /* k is the job's: the same at every put */
        if ((n > h->cap || k != h->k) && grow_choice(h, n > 2 * h->cap ? n : 2 * h->cap, k)) t->oom = 1;
        if (n > h->len && n <= h->cap && k == x->k) {
            size_t m = (size_t)(n - h->len);
            memcpy(h->tok + h->len, x->tok + h->len, sizeof *x->tok * m);
            memcpy(h->lp + h->len, x->lp + h->len, sizeof *x->lp * m);
            if (k) {
                memcpy(h->top_ids + (size_t)h->len * k, x->top_ids + (size_t)h->len * k, sizeof(int) * m * k);
                memcpy(h->top_lps + (size_t)h->len * k, x->top_lps + (size_t)h->len * k, sizeof(float) * m * k);
            }
            h->len = n;
            t->fresh = 1;
        }
    }
    pthread_mutex_unlock(&s->tmu);
}

void api_tap_wake(api_server *s, const char *job_id) {
    if (!s) return;
    pthread_mutex_lock(&s->tmu);
    api_tap *t = find(s, job_id);
    if (t && (t->fresh || t->oom)) resume(t);
    pthread_mutex_unlock(&s->tmu);
}

void api_taps_changed(api_server *s) {
    pthread_mutex_lock(&s->tmu);
    for (api_tap *t = s->taps; t; t = t->next) {
        t->changed = 1;
        resume(t);
    }
    pthread_mutex_unlock(&s->tmu);
}
