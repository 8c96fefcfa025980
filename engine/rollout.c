/* rollout.c — sampling N responses per prompt on any backend.
 *
 * Each prompt is prefilled once; its N responses decode in lockstep against one copy of its
 * KV (cache rows [prompt][resp 0 .. max_tokens)[resp 1 ...]...), all groups of a chunk in one
 * batch per step. Sampling happens on the host from the step's logits: temperature, top_k,
 * top_p, min_p, with one RNG stream per response derived from the request seed, so the same
 * seed gives the same tokens. The logprob reported for a token is log softmax(logits / T) of
 * the untruncated distribution — what the update's old pass recomputes; top_k/top_p/min_p only
 * change which token is drawn. T = 0 is greedy, with logprobs at T = 1.
 *
 * The common RL case — plain temperature sampling or greedy, no top_k/top_p/min_p, no
 * min_tokens ban in force at the step — samples on the device instead (backend op `sample`,
 * kernels/sampling.h: Gumbel-max with a counter-based hash of (response stream, step, id)), so
 * a step downloads R ints + R floats instead of R x V logits. Same seed, same tokens still holds
 * on one backend; the device draw is a different function of the seed than the host draw, and
 * CPU and CUDA logits differ by rounding, so tokens differ across paths and backends.
 * GRPOD_HOST_SAMPLING=1 forces the host path (for comparison). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "engine/err.h"

void eng_sampling_default(eng_sampling *s) {
    memset(s, 0, sizeof *s);
    s->temperature = 1.0f;
    s->top_p = 1.0f;
    s->max_tokens = 16;
}

void eng_group_result_free(eng_group_result *r) {
    if (!r || !r->resp) return;
    for (int i = 0; i < r->n; i++) { free(r->resp[i].tokens); free(r->resp[i].logprobs); free(r->resp[i].text); }
    free(r->resp);
    r->resp = NULL;
}

/* ---------------------------------------------------------------- sampling */

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}
static double uniform(uint64_t *s) { return (splitmix(s) >> 11) * (1.0 / 9007199254740992.0); }

typedef struct { float p; int id; } cand;
static int cand_desc(const void *a, const void *b) {
    float x = ((const cand *)a)->p, y = ((const cand *)b)->p;
    return x < y ? 1 : x > y ? -1 : ((const cand *)a)->id - ((const cand *)b)->id;
}

/* Draws a token from logits (V); banned ids (min_tokens) get no mass. Returns the id and its
 * logprob under softmax(logits / T) (T = 1 when greedy). scratch holds V cands. */
static int sample(const float *logits, int V, const eng_sampling *s, uint64_t *rng, const int *banned, int n_banned,
                  cand *scratch, float *logprob) {
    float T = s->temperature > 0 ? s->temperature : 1.0f;
    float mx = -INFINITY;
    for (int j = 0; j < V; j++) mx = fmaxf(mx, logits[j] / T);
    double sum = 0;
    for (int j = 0; j < V; j++) sum += exp((double)(logits[j] / T - mx));
    float lse = mx + (float)log(sum);
    int n = 0;
    for (int j = 0; j < V; j++) {
        int ban = 0;
        for (int b = 0; b < n_banned && !ban; b++) ban = banned[b] == j;
        if (!ban) scratch[n++] = (cand){ expf(logits[j] / T - lse), j };
    }
    int pick = scratch[0].id;
    if (s->temperature <= 0) {
        for (int i = 1; i < n; i++)
            if (scratch[i].p > scratch[0].p) { scratch[0] = scratch[i]; }
        pick = scratch[0].id;
    } else {
        int truncate = (s->top_k > 0 && s->top_k < n) || s->top_p < 1.0f || s->min_p > 0;
        if (truncate) {
            qsort(scratch, (size_t)n, sizeof *scratch, cand_desc);
            if (s->top_k > 0 && s->top_k < n) n = s->top_k;
            if (s->min_p > 0) {
                float floor_p = s->min_p * scratch[0].p;
                int k = 1;
                while (k < n && scratch[k].p >= floor_p) k++;
                n = k;
            }
            if (s->top_p < 1.0f) {
                double tot = 0, acc = 0;
                for (int i = 0; i < n; i++) tot += scratch[i].p;
                int k = 0;
                while (k < n) { acc += scratch[k].p; k++; if (acc >= s->top_p * tot) break; }
                n = k;
            }
        }
        double tot = 0;
        for (int i = 0; i < n; i++) tot += scratch[i].p;
        double u = uniform(rng) * tot, acc = 0;
        pick = scratch[n - 1].id;
        for (int i = 0; i < n; i++) { acc += scratch[i].p; if (u < acc) { pick = scratch[i].id; break; } }
    }
    *logprob = logits[pick] / T - lse;
    return pick;
}

/* ---------------------------------------------------------------- decode loop */

typedef struct {
    int group, idx;             /* source group and response index */
    int base;                   /* first cache row of this response */
    int prompt0, P;             /* its prompt's cache rows */
    int n, done;
    uint64_t rng;
    eng_response *out;
} stream;

static int is_in(int id, const int *list, int n) {
    for (int i = 0; i < n; i++) if (list[i] == id) return 1;
    return 0;
}

/* Stop-string check on the decoded text; truncates the text before the match. */
static int hit_stop_string(eng *e, eng_response *r, const eng_sampling *s) {
    if (!s->n_stop || !e->tok) return 0;
    char *text;
    size_t len;
    if (tok_decode(e->tok, r->tokens, r->n_tokens, 1, &text, &len)) { err_clear(); return 0; }
    for (int i = 0; i < s->n_stop; i++) {
        char *hit = s->stop[i][0] ? strstr(text, s->stop[i]) : NULL;
        if (hit) {
            *hit = 0;
            free(r->text);
            r->text = text;
            r->text_len = (size_t)(hit - text);
            return 1;
        }
    }
    free(text);
    return 0;
}

/* Records token id (logprob lp) of stream k and decides whether the stream is done. */
static void record_token(eng *e, stream *k, int id, float lp, const eng_sampling *s, const eng_info *info) {
    eng_response *o = k->out;
    o->tokens[o->n_tokens] = id;
    o->logprobs[o->n_tokens] = lp;
    o->n_tokens++;
    int stop = (!s->ignore_eos && is_in(id, info->eos_ids, info->n_eos)) || is_in(id, s->stop_token_ids, s->n_stop_token_ids);
    if (stop || hit_stop_string(e, o, s)) { o->finish = FINISH_STOP; k->done = 1; }
    else if (o->n_tokens >= s->max_tokens) { o->finish = FINISH_LENGTH; k->done = 1; }
}

/* Samples the next token of stream k from its logits row on the host and records it. */
static void step_stream(eng *e, stream *k, const float *row, const eng_sampling *s, const eng_info *info,
                        const int *banned, int n_banned, cand *scratch) {
    int ban = k->out->n_tokens < s->min_tokens ? n_banned : 0;
    float lp;
    int id = sample(row, info->vocab, s, &k->rng, banned, ban, scratch, &lp);
    record_token(e, k, id, lp, s, info);
}

/* Device path: rows [0, B) of dlogits belong to streams live[0 .. B), all at token index
 * step; draws on the device and downloads B ids + B logprobs. dsamp holds n_resp keys, ids
 * and logprobs; hbuf the same on the host. */
static int sample_on_device(eng *e, stream *st, const int *live, int B, int step, const float *dlogits,
                            void *dsamp, void *hbuf, int n_resp, const eng_sampling *s, const eng_info *info) {
    eng_backend *be = e->be;
    uint64_t *hkeys = hbuf, *dkeys = dsamp;
    int *htok = (int *)(hkeys + n_resp), *dtok = (int *)(dkeys + n_resp);
    float *hlp = (float *)(htok + n_resp), *dlp = (float *)(dtok + n_resp);
    for (int b = 0; b < B; b++) hkeys[b] = st[live[b]].rng;
    int rc = be->to_dev(be, dkeys, hkeys, (size_t)B * sizeof(uint64_t));
    if (rc) return rc;
    be->sample(be, dtok, dlp, dlogits, dkeys, (uint64_t)step, B, info->vocab, s->temperature);
    if ((rc = be->to_host(be, htok, dtok, (size_t)B * sizeof(int))) ||
        (rc = be->to_host(be, hlp, dlp, (size_t)B * sizeof(float))))
        return rc;
    for (int b = 0; b < B; b++) record_token(e, &st[live[b]], htok[b], hlp[b], s, info);
    return 0;
}

/* Runs groups[g0 .. g1) through prefill and decode. */
static int run_chunk(eng *e, const eng_rollout_group *groups, int g0, int g1, const eng_sampling *s,
                     eng_group_result *out, eng_progress_cb cb, void *ud, double *done_frac, double frac_per_step) {
    const model_config *c = &e->m.cfg;
    eng_backend *be = e->be;
    eng_info info;
    eng_get_info(e, &info);
    int maxt = s->max_tokens, P_tot = 0, n_resp = 0, ng = g1 - g0;
    for (int g = g0; g < g1; g++) { P_tot += groups[g].P; n_resp += groups[g].n; }
    int T = P_tot > n_resp ? P_tot : n_resp;
    model_kv kv;
    int rc = model_kv_init(&e->m, &kv, P_tot + n_resp * maxt);
    if (rc) return rc;
    stream *st = calloc((size_t)n_resp, sizeof *st);
    int *ints = malloc((size_t)T * 7 * sizeof(int));
    float *logits = malloc((size_t)n_resp * c->V * sizeof(float));
    cand *scratch = malloc((size_t)c->V * sizeof(cand));
    int *banned = malloc((size_t)(info.n_eos + s->n_stop_token_ids + 1) * sizeof(int));
    float *dlogits = be->alloc(be, (size_t)n_resp * c->V * sizeof(float));
    int *drows = be->alloc(be, (size_t)T * sizeof(int));
    void *dsamp = be->alloc(be, (size_t)n_resp * 16), *hsamp = malloc((size_t)n_resp * 16);
    int *live = malloc((size_t)n_resp * sizeof(int));
    if (!st || !ints || !logits || !scratch || !banned || !dlogits || !drows || !dsamp || !hsamp || !live) {
        rc = err_set(GE_NOMEM, "rollout: out of memory");
        goto out;
    }
    int *tok = ints, *pos = ints + T, *a0 = ints + 2 * T, *a1 = ints + 3 * T, *b0 = ints + 4 * T, *b1 = ints + 5 * T,
        *slot = ints + 6 * T;
    int n_banned = 0;
    if (!s->ignore_eos) for (int i = 0; i < info.n_eos; i++) banned[n_banned++] = info.eos_ids[i];
    for (int i = 0; i < s->n_stop_token_ids; i++) banned[n_banned++] = s->stop_token_ids[i];
    const char *force_host = getenv("GRPOD_HOST_SAMPLING");
    int dev_ok = be->sample && (s->top_k <= 0 || s->top_k >= c->V) && s->top_p >= 1.0f && s->min_p <= 0 &&
                 !(force_host && force_host[0] == '1');

    /* Prefill: every prompt once, causal on itself; cache rows [0, P_tot) are the prompts. */
    int row = 0, k = 0, resp_row = P_tot;
    for (int g = g0; g < g1; g++) {
        const eng_rollout_group *G = &groups[g];
        out[g].n = G->n;
        out[g].resp = calloc((size_t)G->n, sizeof(eng_response));
        if (!out[g].resp) { rc = err_set(GE_NOMEM, "rollout: out of memory"); goto out; }
        for (int i = 0; i < G->P; i++) {
            tok[row + i] = G->prompt[i]; pos[row + i] = i; slot[row + i] = row + i;
            a0[row + i] = row; a1[row + i] = row + i + 1; b0[row + i] = b1[row + i] = 0;
        }
        for (int r = 0; r < G->n; r++, k++) {
            st[k] = (stream){ .group = g, .idx = r, .base = resp_row, .prompt0 = row, .P = G->P,
                              .rng = s->seed ^ ((uint64_t)(g + 1) * 0xD1B54A32D192ED03ULL) ^ ((uint64_t)(r + 1) << 32),
                              .out = &out[g].resp[r] };
            splitmix(&st[k].rng);
            resp_row += maxt;
            eng_response *o = st[k].out;
            o->tokens = malloc((size_t)(maxt ? maxt : 1) * sizeof(int));
            o->logprobs = malloc((size_t)(maxt ? maxt : 1) * sizeof(float));
            if (!o->tokens || !o->logprobs) { rc = err_set(GE_NOMEM, "rollout: out of memory"); goto out; }
        }
        row += G->P;
    }
    model_input in = { .T = P_tot, .tokens = tok, .pos = pos, .a0 = a0, .a1 = a1, .b0 = b0, .b1 = b1, .slot = slot };
    if ((rc = eng_acts_reserve(e, &e->acts_ng, T, 1, 0)) ||
        (rc = model_forward(&e->m, &e->wv, &e->acts_ng, &kv, &in, 1.0f, 0)))
        goto out;
    /* First tokens: one logits row per prompt (its last token), shared by its N responses. */
    if (maxt <= 0) {
        for (k = 0; k < n_resp; k++) st[k].done = 1, st[k].out->finish = FINISH_LENGTH;
    } else if (dev_ok && !(s->min_tokens > 0 && n_banned > 0)) {
        /* one logits row per response (its prompt's last token), sampled on the device */
        for (k = 0; k < n_resp; k++) { tok[k] = st[k].prompt0 + st[k].P - 1; live[k] = k; }
        if ((rc = be->to_dev(be, drows, tok, (size_t)n_resp * sizeof(int)))) goto out;
        be->lm_head_rows(be, dlogits, e->acts_ng.lnf, drows, e->wv.lm_head, n_resp, c->C, c->V);
        if ((rc = sample_on_device(e, st, live, n_resp, 0, dlogits, dsamp, hsamp, n_resp, s, &info))) goto out;
    } else {
        for (int g = g0, r0 = 0; g < g1; r0 += groups[g].P, g++) tok[g - g0] = r0 + groups[g].P - 1;
        if ((rc = be->to_dev(be, drows, tok, (size_t)ng * sizeof(int)))) goto out;
        be->lm_head_rows(be, dlogits, e->acts_ng.lnf, drows, e->wv.lm_head, ng, c->C, c->V);
        if ((rc = be->sync(be)) || (rc = be->to_host(be, logits, dlogits, (size_t)ng * c->V * sizeof(float)))) goto out;
        for (k = 0; k < n_resp; k++)
            step_stream(e, &st[k], logits + (size_t)(st[k].group - g0) * c->V, s, &info, banned, n_banned, scratch);
    }
    *done_frac += frac_per_step;
    if (cb) cb(ud, *done_frac);

    /* Decode: each step feeds every live response's last token and samples its next. */
    for (int step = 1; step < maxt; step++) {
        int B = 0;
        for (k = 0; k < n_resp; k++) if (!st[k].done) live[B++] = k;
        if (!B) break;
        for (int b = 0; b < B; b++) {
            stream *x = &st[live[b]];
            int n = x->out->n_tokens;
            tok[b] = x->out->tokens[n - 1];
            pos[b] = x->P + n - 1;
            slot[b] = x->base + n - 1;
            a0[b] = x->prompt0; a1[b] = x->prompt0 + x->P;
            b0[b] = x->base; b1[b] = x->base + n;
        }
        model_input d = { .T = B, .tokens = tok, .pos = pos, .a0 = a0, .a1 = a1, .b0 = b0, .b1 = b1, .slot = slot };
        if ((rc = model_forward(&e->m, &e->wv, &e->acts_ng, &kv, &d, 1.0f, 0))) break;
        for (int b = 0; b < B; b++) a0[b] = b;   /* row indices for the lm-head, after the forward */
        if ((rc = be->to_dev(be, drows, a0, (size_t)B * sizeof(int)))) break;
        be->lm_head_rows(be, dlogits, e->acts_ng.lnf, drows, e->wv.lm_head, B, c->C, c->V);
        if (dev_ok && !(step < s->min_tokens && n_banned > 0)) {
            if ((rc = sample_on_device(e, st, live, B, step, dlogits, dsamp, hsamp, n_resp, s, &info))) break;
            *done_frac += frac_per_step;
            if (cb) cb(ud, *done_frac);
            continue;
        }
        if ((rc = be->sync(be)) || (rc = be->to_host(be, logits, dlogits, (size_t)B * c->V * sizeof(float)))) break;
        for (int b = 0; b < B; b++) step_stream(e, &st[live[b]], logits + (size_t)b * c->V, s, &info, banned, n_banned, scratch);
        *done_frac += frac_per_step;
        if (cb) cb(ud, *done_frac);
    }
    /* Text of every response (stop-string hits already hold their truncated text). */
    for (k = 0; k < n_resp && !rc; k++) {
        eng_response *o = st[k].out;
        if (o->text || !e->tok) continue;
        rc = tok_decode(e->tok, o->tokens, o->n_tokens, 1, &o->text, &o->text_len);
    }
out:
    if (dlogits) be->free(be, dlogits);
    if (drows) be->free(be, drows);
    if (dsamp) be->free(be, dsamp);
    model_kv_free(&e->m, &kv);
    free(st); free(ints); free(logits); free(scratch); free(banned); free(hsamp); free(live);
    return rc;
}

/* Groups run in chunks whose KV rows fit a budget, so a large request does not need one
 * cache for everything. */
int eng_rollout(eng *e, const eng_rollout_group *groups, int n_groups, const eng_sampling *s,
                eng_group_result *out, eng_progress_cb cb, void *ud) {
    const long long budget = 1LL << 20;   /* KV rows per chunk */
    memset(out, 0, (size_t)n_groups * sizeof *out);
    double frac = 0, per = 1.0 / ((double)(s->max_tokens > 0 ? s->max_tokens : 1) * (n_groups ? n_groups : 1));
    int rc = 0;
    for (int g0 = 0; g0 < n_groups && !rc;) {
        long long rows = 0;
        int g1 = g0;
        while (g1 < n_groups) {
            long long r = groups[g1].P + (long long)groups[g1].n * s->max_tokens;
            if (g1 > g0 && rows + r > budget) break;
            rows += r;
            g1++;
        }
        rc = run_chunk(e, groups, g0, g1, s, out, cb, ud, &frac, per * (g1 - g0));
        g0 = g1;
    }
    if (rc)
        for (int g = 0; g < n_groups; g++) eng_group_result_free(&out[g]);
    return rc;
}
