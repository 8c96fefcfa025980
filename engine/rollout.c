/* rollout.c — sampling N responses per prompt on any backend.
 *
 * Each prompt is prefilled once; its N responses decode in lockstep against one copy of its
 * KV (cache rows [prompt][resp 0 .. max_tokens)[resp 1 ...]...), all groups of a chunk in one
 * batch per step. A step's device work — the forward, the lm head, the draws — is dec_step
 * (decode.c); this file decides which responses run, where their K/V live and when they stop.
 * Each response has a stream seed derived from the request seed, its group and its index;
 * token i is drawn with key dec_key(stream, i), so the same seed gives the same tokens. */
#include <stdlib.h>
#include <string.h>

#include "engine/decode.h"
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

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
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

/* The draw parameters of stream k's next token. */
static dec_row row_of(const stream *k, const eng_sampling *s) {
    return (dec_row){ .temperature = s->temperature, .top_k = s->top_k, .top_p = s->top_p, .min_p = s->min_p,
                      .ban = k->out->n_tokens < s->min_tokens, .key = dec_key(k->rng, k->out->n_tokens) };
}

/* Runs groups[g0 .. g1) through prefill and decode. */
static int run_chunk(eng *e, const eng_rollout_group *groups, int g0, int g1, const eng_sampling *s,
                     eng_group_result *out, eng_progress_cb cb, void *ud, double *done_frac, double frac_per_step) {
    eng_info info;
    eng_get_info(e, &info);
    int maxt = s->max_tokens, P_tot = 0, n_resp = 0;
    for (int g = g0; g < g1; g++) { P_tot += groups[g].P; n_resp += groups[g].n; }
    int T = P_tot > n_resp ? P_tot : n_resp;
    model_kv kv;
    int rc = model_kv_init(&e->m, &kv, P_tot + n_resp * maxt);
    if (rc) return rc;
    stream *st = calloc((size_t)n_resp, sizeof *st);
    int *ints = malloc((size_t)T * 9 * sizeof(int));
    float *lps = malloc((size_t)n_resp * sizeof(float));
    dec_row *rp = malloc((size_t)n_resp * sizeof *rp);
    int *banned = malloc((size_t)(info.n_eos + s->n_stop_token_ids + 1) * sizeof(int));
    int *live = malloc((size_t)n_resp * sizeof(int));
    if (!st || !ints || !lps || !rp || !banned || !live) {
        rc = err_set(GE_NOMEM, "rollout: out of memory");
        goto out;
    }
    int *tok = ints, *pos = ints + T, *a0 = ints + 2 * T, *a1 = ints + 3 * T, *b0 = ints + 4 * T, *b1 = ints + 5 * T,
        *slot = ints + 6 * T, *rows = ints + 7 * T, *ids = ints + 8 * T;
    int n_banned = 0;
    if (!s->ignore_eos) for (int i = 0; i < info.n_eos; i++) banned[n_banned++] = info.eos_ids[i];
    for (int i = 0; i < s->n_stop_token_ids; i++) banned[n_banned++] = s->stop_token_ids[i];

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
    /* The prefill draws every response's first token from its prompt's last row. */
    int R0 = maxt > 0 ? n_resp : 0;
    for (k = 0; k < R0; k++) { rows[k] = st[k].prompt0 + st[k].P - 1; rp[k] = row_of(&st[k], s); }
    model_input in = { .T = P_tot, .tokens = tok, .pos = pos, .a0 = a0, .a1 = a1, .b0 = b0, .b1 = b1, .slot = slot };
    if ((rc = dec_step(e, &kv, &in, R0, rows, rp, banned, n_banned, ids, lps))) goto out;
    if (maxt <= 0)
        for (k = 0; k < n_resp; k++) st[k].done = 1, st[k].out->finish = FINISH_LENGTH;
    for (k = 0; k < R0; k++) record_token(e, &st[k], ids[k], lps[k], s, &info);
    *done_frac += frac_per_step;
    if (cb) cb(ud, *done_frac);

    /* Decode: each step feeds every live response's last token and draws its next. */
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
            rows[b] = b;
            rp[b] = row_of(x, s);
        }
        model_input d = { .T = B, .tokens = tok, .pos = pos, .a0 = a0, .a1 = a1, .b0 = b0, .b1 = b1, .slot = slot };
        if ((rc = dec_step(e, &kv, &d, B, rows, rp, banned, n_banned, ids, lps))) break;
        for (int b = 0; b < B; b++) record_token(e, &st[live[b]], ids[b], lps[b], s, &info);
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
    model_kv_free(&e->m, &kv);
    free(st); free(ints); free(lps); free(rp); free(banned); free(live);
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
