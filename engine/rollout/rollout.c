/* rollout.c — sampling N responses per prompt: the continuous-batching scheduler (eng_sched)
 * and eng_rollout on top of it; see engine.h for the contract.
 *
 * KV layout: one model_kv pool of cap rows; engine/model/kvpool.c hands out contiguous ranges. An
 * admitted group holds [prompt: P rows] and, per response, [max_tokens rows]; its N responses
 * attend to the one prompt copy (key ranges a = prompt rows, b = own rows). All rows a group
 * can ever need are taken at admission, so a step never runs out of rows and nothing is
 * preempted; a response's range is freed as it finishes, the prompt's with the group's last.
 *
 * Hybrid models (gated DeltaNet layers) keep K/V rows for their attention layers only and,
 * beside them, state rows (model.h model_kv_states_init): an admitted group takes n + 1
 * contiguous ones from a second pool, the prompt's first. The prefill runs the prompt once into
 * its row (zeroed at admission); each response's row then starts as a copy of it (one prefill,
 * N copies: the P + NR idea for recurrent state), and each decode step updates a response's row
 * in place. The rows go back when the group is swept. The prefix cache is skipped for these
 * models: an entry keeps K/V rows, and the state after an arbitrary prefix of it (what a partial
 * hit needs) exists only at the positions that happened to be kept; a second turn prefills.
 *
 * A step's device work is dec_step (decode.c): the forward of T tokens, one keyed draw for
 * each chosen row. This file decides which responses run, where their K/V live and when they
 * stop. Each response has a stream seed derived from the request seed, its group index in its
 * request and its index; token i is drawn with key dec_key(stream, i), so the same seed gives
 * the same tokens whatever else is in the batch.
 * Legend: P prompt tokens, N responses of a group, T tokens in a forward, R sampled rows. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "engine/rollout/decode.h"
#include "engine/engine_internal.h"
#include "engine/model/kvpool.h"
#include "engine/rollout/guided.h"
#include "engine/rollout/prefix.h"
#include "engine/rollout/routes.h"

void eng_group_result_free(eng_group_result *r) {
    if (!r || !r->resp) return;
    for (int i = 0; i < r->n; i++) {
        free(r->resp[i].tokens);
        free(r->resp[i].logprobs);
        free(r->resp[i].text);
        free(r->resp[i].routes);
        free(r->resp[i].top_ids);
        free(r->resp[i].top_lps);
    }
    free(r->resp);
    free(r->prompt_routes);
    r->prompt_routes = NULL;
    r->resp = NULL;
    r->n = 0;
}

/* splitmix64: the state steps by the golden gamma, the output is its finalizer (sampling_mix). */
static uint64_t splitmix(uint64_t *s) { return sampling_mix(*s += 0x9E3779B97F4A7C15ULL); }

/* ---------------------------------------------------------------- objects */

typedef struct sgroup sgroup;

typedef struct {
    sgroup *grp;
    int idx; /* response index in its group */
    int base; /* first of its max_tokens cache rows */
    pfx_block *blk; /* those rows */
    int done;
    int rcap; /* rows of out->routes (routes.h rt_row) */
    uint64_t rng; /* stream seed */
    jg_state gs; /* guided jobs: where the response is in the grammar */
    eng_response *out;
} stream;

struct sgroup {
    eng_sched_job *job;
    int g; /* group index in its job's request */
    int prompt0, P; /* its prompt's cache rows */
    pfx_block *pblk; /* those rows */
    int cached; /* prompt ids whose K/V were copied from the prefix cache, not prefilled */
    int st0; /* hybrid models: its state rows st0 (the prompt) and st0 + 1 + r (response r); -1 none */
    int n, n_live;
    int fresh; /* admitted this step: prefill pending */
    int dead; /* every response finished or dropped; rows given back */
    stream *st; /* (n) */
};

struct eng_sched_job {
    const eng_rollout_group *groups;
    int n_groups;
    eng_sampling sp; /* the caller's; its arrays stay the caller's */
    eng_group_result *out;
    int ban[16 + 64];
    int n_ban; /* eos ids (unless ignore_eos) + stop token ids, for min_tokens */
    int *ban_heap; /* when they do not fit ban[] */
    jg_spec *gram; /* sampling.guided: the grammar every response follows (NULL: none); the
                      ban list is then its end ids */
    int next_group; /* groups [0, next_group) were admitted */
    int live_groups;
    long long tok_done, tok_total; /* progress: finished responses count max_tokens */
    int state; /* 0 running, 1 done, < 0 failed */
    char msg[256];
    eng_sched_job *next; /* the scheduler's jobs, in the order they were added */
};

struct eng_sched {
    eng *e;
    eng_info info;
    int cap; /* pool rows */
    long long row_bytes;
    int max_prefill, max_running;
    kvp pool;
    kvp spool; /* state rows (hybrid models; cap_st 0: none) */
    int cap_st;
    long long st_bytes; /* one state row */
    pfx_cache pfx; /* finished responses' rows (prefix.h) */
    model_kv kv; /* allocated while busy or while the prefix cache holds rows */
    eng_sched_job *jobs, *jobs_tail;
    sgroup **live;
    int n_live, cap_live;
    int running; /* responses not done in live groups */
    long long steps, dec_calls;
    /* step buffers, grown on demand */
    int cap_T, cap_R;
    int *ints; /* tok, pos, a0, a1, b0, b1, slot, srow (cap_T each) */
    int *rows, *ids; /* (cap_R) */
    float *lps; /* (cap_R) */
    sample_params *rp; /* (cap_R) */
    stream **who; /* (cap_R) the stream each drawn row belongs to */
    void **items;
    char *taken;
    int cap_items;
    rt_rec rt; /* a step's MoE routes and where each token's go (routes.h) */
    gd_masks masks; /* a call's allow masks, one per guided row (guided.h) */
    /* a call's rows whose job wants top_logprobs: their row indices, and each row's place among
     * them (-1: none); the top tokens (cap_R, ENG_TOP_MAX) */
    int *top_rows, *top_at, n_top, top_k;
    int *top_ids;
    float *top_lps;
};

static const int *job_ban(const eng_sched_job *j) { return j->ban_heap ? j->ban_heap : j->ban; }

/* ---------------------------------------------------------------- sizing */

#define CPU_DEFAULT_ROWS (1 << 18)
#define CPU_DEFAULT_CAP_BYTES (8LL << 30)

/* Free device memory, or -1 when not known (cpu: host memory). */
static long long device_free_bytes(eng *e) { return e->be->mem_free ? e->be->mem_free(e->be) : -1; }

/* Prompts decoding beside max_running responses that state rows are kept for. */
enum { ST_PROMPTS = 64 };

/* The pool's budget in bytes; -1: none known (cpu: host memory, CPU_DEFAULT_CAP_BYTES bounds). */
static long long pool_budget(eng *e, const eng_sched_opts *o) {
    long long budget = o ? o->kv_bytes : 0;
    if (budget > 0) return budget;
    long long fr = device_free_bytes(e);
    if (fr < 0) return -1;
    /* the memory plan's budget (engine/plan.c); without one (an engine that never trains) half
     * of what is free */
    budget = e->plan.kv_bytes > 0 ? e->plan.kv_bytes : fr / 2;
    return budget < fr / 8 ? fr / 8 : budget;
}

/* Sizes s->cap (K/V rows) and s->cap_st (state rows): the state rows of max_running responses
 * and ST_PROMPTS prompts, within half the budget, then K/V rows in the rest. */
static long long size_pools(eng_sched *s, const eng_sched_opts *o) {
    long long budget = pool_budget(s->e, o), rb = s->row_bytes;
    if (s->st_bytes) {
        long long want = (long long)s->max_running + ST_PROMPTS, cap = budget < 0 ? CPU_DEFAULT_CAP_BYTES : budget;
        if (want * s->st_bytes > cap / 2) want = cap / 2 / s->st_bytes;
        s->cap_st = (int)want;
        if (budget > 0) budget -= want * s->st_bytes;
    }
    if (o && o->kv_rows > 0) return o->kv_rows;
    if (budget < 0) {
        long long rows = CPU_DEFAULT_ROWS;
        if (rows * rb > CPU_DEFAULT_CAP_BYTES) rows = CPU_DEFAULT_CAP_BYTES / rb;
        return rows;
    }
    return budget / rb;
}

int eng_sched_open(eng *e, const eng_sched_opts *o, eng_sched **out) {
    *out = NULL;
    eng_sched *s = calloc(1, sizeof *s);
    if (!s) return err_set(GE_NOMEM, "scheduler: out of memory");
    s->e = e;
    eng_get_info(e, &s->info);
    const model *dm = eng_dec_model(e);
    s->row_bytes = model_kv_row_bytes(dm);
    s->st_bytes = model_state_row_bytes(dm);
    s->max_prefill = o && o->max_prefill_tokens > 0 ? o->max_prefill_tokens : 8192;
    s->max_running = o && o->max_running > 0 ? o->max_running : 1024;
    long long rows = size_pools(s, o);
    if (rows > 0x7fffffff - 1) rows = 0x7fffffff - 1;
    if (rows < 1 || (s->st_bytes && s->cap_st < 2)) {
        long long rb = s->row_bytes, sb = s->st_bytes;
        free(s);
        if (sb) return err_set(GE_NOMEM, "KV pool: the budget holds no row (%lld bytes per row, %lld per state row)", rb, sb);
        return err_set(GE_NOMEM, "KV pool: the budget holds no row (%lld bytes per row)", rb);
    }
    s->cap = (int)rows;
    s->rt.W = config_n_moe(&dm->cfg) * dm->cfg.top_k;
    int rc = kvp_init(&s->pool, s->cap);
    if (!rc && s->cap_st && (rc = kvp_init(&s->spool, s->cap_st))) kvp_destroy(&s->pool);
    if (rc) {
        free(s);
        return rc;
    }
    s->pfx.epoch = e->weights_epoch;
    if (!e->sched) e->sched = s; /* the one eng_update empties (sched_forget) */
    *out = s;
    return 0;
}

/* The device memory of the K/V rows and (hybrid models) the state rows. */
static int kv_open(eng_sched *s) {
    const model *dm = eng_dec_model(s->e);
    int rc = model_kv_init(dm, &s->kv, s->cap);
    if (!rc && s->cap_st && (rc = model_kv_states_init(dm, &s->kv, s->cap_st))) model_kv_free(dm, &s->kv);
    return rc;
}

void sched_forget(eng_sched *s) {
    pfx_clear(&s->pfx, &s->pool);
    if (!eng_sched_busy(s) && s->kv.mem) model_kv_free(eng_dec_model(s->e), &s->kv);
}

long long eng_sched_rows_needed(const eng_rollout_group *g, const eng_sampling *sp) {
    return sp->max_tokens > 0 ? g->P + (long long)g->n * sp->max_tokens : 0;
}

/* Grows the step buffers to T tokens, R rows and I partition items. */
static int reserve(eng_sched *s, int T, int R, int I) {
    if (rt_reserve(&s->rt, T)) return GE_NOMEM;
    if (T > s->cap_T) {
        int *p = realloc(s->ints, (size_t)T * 8 * sizeof(int));
        if (!p) return err_set(GE_NOMEM, "scheduler: out of memory for %d tokens", T);
        s->ints = p;
        s->cap_T = T;
    }
    if (R > s->cap_R) {
        int *r = realloc(s->rows, (size_t)R * sizeof(int)), *i = r ? realloc(s->ids, (size_t)R * sizeof(int)) : NULL;
        if (r) s->rows = r;
        if (i) s->ids = i;
        float *l = i ? realloc(s->lps, (size_t)R * sizeof(float)) : NULL;
        if (l) s->lps = l;
        sample_params *p = l ? realloc(s->rp, (size_t)R * sizeof(sample_params)) : NULL;
        if (p) s->rp = p;
        stream **w = p ? realloc(s->who, (size_t)R * sizeof(stream *)) : NULL;
        if (w) s->who = w;
        int *tr = w ? realloc(s->top_rows, (size_t)R * 2 * sizeof(int)) : NULL;
        if (tr) s->top_rows = tr, s->top_at = tr + R;
        int *ti = tr ? realloc(s->top_ids, (size_t)R * ENG_TOP_MAX * sizeof(int)) : NULL;
        if (ti) s->top_ids = ti;
        float *tl = ti ? realloc(s->top_lps, (size_t)R * ENG_TOP_MAX * sizeof(float)) : NULL;
        if (!tl) return err_set(GE_NOMEM, "scheduler: out of memory for %d rows", R);
        s->top_lps = tl;
        s->cap_R = R;
    }
    if (I > s->cap_items) {
        void **it = realloc(s->items, (size_t)I * sizeof(void *));
        if (it) s->items = it;
        char *tk = it ? realloc(s->taken, (size_t)I) : NULL;
        if (!tk) return err_set(GE_NOMEM, "scheduler: out of memory for %d items", I);
        s->taken = tk;
        s->cap_items = I;
    }
    return 0;
}

/* ---------------------------------------------------------------- stop conditions */

static int is_in(int id, const int *list, int n) {
    for (int i = 0; i < n; i++)
        if (list[i] == id) return 1;
    return 0;
}

/* Stop-string check on the decoded text; truncates the text before the match. */
static int hit_stop_string(eng *e, eng_response *r, const eng_sampling *s) {
    if (!s->n_stop || !e->tok) return 0;
    char *text;
    size_t len;
    if (tok_decode(e->tok, r->tokens, r->n_tokens, 1, &text, &len)) {
        err_clear();
        return 0;
    }
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

/* The draw parameters of stream k's next token (a guided job's rows: no ban, the grammar ends them). */
static sample_params row_of(const stream *k) {
    const eng_sampling *s = &k->grp->job->sp;
    return (sample_params){.temperature = s->temperature,
                           .top_k = s->top_k,
                           .top_p = s->top_p,
                           .min_p = s->min_p,
                           .ban = !k->grp->job->gram && k->out->n_tokens < s->min_tokens,
                           .key = dec_key(k->rng, k->out->n_tokens)};
}

/* ---------------------------------------------------------------- retiring */

/* Stops every stream of G that still runs and gives back all of G's rows. */
static void drop_group(eng_sched *s, sgroup *G) {
    if (G->dead) return;
    for (int r = 0; r < G->n; r++) {
        stream *k = &G->st[r];
        if (k->done) continue;
        k->done = 1;
        pfx_unref(&s->pool, k->blk);
        s->running--;
    }
    pfx_unref(&s->pool, G->pblk);
    G->n_live = 0;
    G->dead = 1;
    G->job->live_groups--;
}

/* Ends job j with state (< 0: failed or cancelled): its groups stop, out is emptied. */
static void job_stop(eng_sched *s, eng_sched_job *j, int state, const char *msg) {
    if (j->state) return;
    for (int i = 0; i < s->n_live; i++)
        if (s->live[i]->job == j) drop_group(s, s->live[i]);
    j->next_group = j->n_groups;
    for (int g = 0; g < j->n_groups; g++) eng_group_result_free(&j->out[g]);
    j->state = state;
    snprintf(j->msg, sizeof j->msg, "%s", msg && msg[0] ? msg : err_default(state));
}

/* Response k is finished: the prefix cache keeps its rows (the K/V of its prompt and of every
 * token but its last, which was never fed), its text is decoded; the group and job complete
 * with their last response. */
static void finish_stream(eng_sched *s, stream *k) {
    sgroup *G = k->grp;
    eng_sched_job *j = G->job;
    eng_response *o = k->out;
    k->done = 1;
    if (s->rt.W) rt_fit(&o->routes, &k->rcap, o->n_tokens, s->rt.W); /* the last row: -1, never fed */
    if (o->n_tokens > 0 && !s->cap_st &&
        pfx_keep(&s->pfx, &s->pool, j->groups[G->g].prompt, G->P, G->pblk, o->tokens, o->n_tokens - 1, k->blk))
        err_clear(); /* not kept: only a later prefill is lost */
    pfx_unref(&s->pool, k->blk);
    s->running--;
    j->tok_done += j->sp.max_tokens - o->n_tokens;
    if (!o->text && s->e->tok) {
        int rc = tok_decode(s->e->tok, o->tokens, o->n_tokens, 1, &o->text, &o->text_len);
        if (rc) {
            job_stop(s, j, rc, err_msg());
            return;
        }
    }
    if (--G->n_live == 0) {
        pfx_unref(&s->pool, G->pblk);
        G->dead = 1;
        j->live_groups--;
    }
}

/* Records token id (logprob lp; top_ids / top_lps: its row's top tokens, at least the job's k of
 * them, or NULL) of stream k and decides whether it is done. */
static void record_token(eng_sched *s, stream *k, int id, float lp, const int *top_ids, const float *top_lps) {
    if (k->done || k->grp->job->state) return;
    const eng_sampling *sp = &k->grp->job->sp;
    const eng_info *info = &s->info;
    eng_response *o = k->out;
    eng_sched_job *j = k->grp->job;
    o->tokens[o->n_tokens] = id;
    o->logprobs[o->n_tokens] = lp;
    if (o->top_ids && top_ids) {
        size_t kk = (size_t)sp->top_logprobs;
        memcpy(o->top_ids + (size_t)o->n_tokens * kk, top_ids, sizeof(int) * kk);
        memcpy(o->top_lps + (size_t)o->n_tokens * kk, top_lps, sizeof(float) * kk);
    }
    o->n_tokens++;
    j->tok_done++;
    if (j->gram) gd_advance(s->e, j->gram, &k->gs, id);
    int stop = (!sp->ignore_eos && is_in(id, info->eos_ids, info->n_eos)) || is_in(id, sp->stop_token_ids, sp->n_stop_token_ids) ||
        (j->gram && !j->n_ban && jg_complete(j->gram, &k->gs)); /* no end id to draw */
    if (stop || hit_stop_string(s->e, o, sp)) o->finish = FINISH_STOP;
    else if (o->n_tokens >= sp->max_tokens) o->finish = FINISH_LENGTH;
    else return;
    finish_stream(s, k);
}

/* Removes dead groups from the live list (keeping order), frees the pool's memory when the
 * scheduler is empty, and marks jobs whose every group completed as done. */
static void sweep(eng_sched *s) {
    int w = 0;
    for (int i = 0; i < s->n_live; i++) {
        sgroup *G = s->live[i];
        if (G->dead) {
            if (G->st0 >= 0) kvp_release(&s->spool, G->st0, G->n + 1);
            free(G->st);
            free(G);
        } else s->live[w++] = G;
    }
    s->n_live = w;
    for (eng_sched_job *j = s->jobs; j; j = j->next)
        if (!j->state && j->next_group == j->n_groups && !j->live_groups) j->state = 1;
    if (!eng_sched_busy(s) && !s->pfx.n && s->kv.mem) model_kv_free(eng_dec_model(s->e), &s->kv);
}

/* ---------------------------------------------------------------- admission */

static int job_rows_fit(const eng_sched *s, const eng_sched_job *j, int g) {
    return eng_sched_rows_needed(&j->groups[g], &j->sp) <= s->cap && (!s->cap_st || j->groups[g].n + 1 <= s->cap_st);
}

/* Gives back what admit_group took: rb[0, n) and pb (NULL: none). */
static void untake(eng_sched *s, pfx_block *pb, pfx_block **rb, int n) {
    for (int r = 0; r < n; r++) pfx_unref(&s->pool, rb[r]);
    pfx_unref(&s->pool, pb);
    free(rb);
}

/* Takes the rows of group g of j: its prompt's (the longest prefix the prefix cache holds
 * copied in, all but the last id at most, so the prefill draws the first tokens) and each
 * response's. 1 admitted, 0 no room (nothing taken), < 0 error. */
static int admit_group(eng_sched *s, eng_sched_job *j, int g) {
    const eng_rollout_group *RG = &j->groups[g];
    int maxt = j->sp.max_tokens, rc = 0, r = 0;
    if (s->n_live == s->cap_live) {
        int nc = s->cap_live ? s->cap_live * 2 : 16;
        sgroup **l = realloc(s->live, (size_t)nc * sizeof *l);
        if (!l) return err_set(GE_NOMEM, "scheduler: out of memory");
        s->live = l;
        s->cap_live = nc;
    }
    int st0 = -1;
    if (s->cap_st && (st0 = kvp_alloc(&s->spool, RG->n + 1)) < 0) return st0 == -1 ? 0 : st0;
    pfx_src src;
    int m = s->cap_st ? (memset(&src, 0, sizeof src), 0) : pfx_match(&s->pfx, RG->prompt, RG->P, RG->P - 1, &src);
    pfx_block *pb = pfx_alloc(&s->pfx, &s->pool, RG->P, &rc), **rb = calloc((size_t)RG->n, sizeof *rb);
    if (!rb && pb) rc = err_set(GE_NOMEM, "scheduler: out of memory");
    for (; pb && rb && r < RG->n; r++)
        if (!(rb[r] = pfx_alloc(&s->pfx, &s->pool, maxt, &rc))) break;
    if (!pb || !rb || r < RG->n) {
        pfx_src_release(&s->pool, &src);
        untake(s, pb, rb, r);
        if (st0 >= 0) kvp_release(&s->spool, st0, RG->n + 1);
        return rc;
    }
    int end = pb->start + RG->P; /* the rows a step of this group can load: none left as they were */
    for (r = 0; r < RG->n; r++) end = rb[r]->start + maxt > end ? rb[r]->start + maxt : end;
    model_kv_clean_to(eng_dec_model(s->e), &s->kv, (end + 255) & ~255); /* to a whole tile past the last */
    if (m) { /* the hit's rows, in at most two runs */
        int n0 = m < src.seg_n[0] ? m : src.seg_n[0];
        model_kv_copy_rows(eng_dec_model(s->e), &s->kv, pb->start, src.seg[0]->start, n0);
        if (m > n0) model_kv_copy_rows(eng_dec_model(s->e), &s->kv, pb->start + n0, src.seg[1]->start, m - n0);
        s->pfx.hits++;
        s->pfx.hit_tokens += m;
    }
    s->pfx.query_tokens += RG->P;
    pfx_src_release(&s->pool, &src);
    sgroup *G = calloc(1, sizeof *G);
    stream *st = calloc((size_t)RG->n, sizeof *st);
    eng_response *resp = calloc((size_t)RG->n, sizeof *resp);
    int ok = G && st && resp;
    int W = s->rt.W, *proutes = rt_rows(W, RG->P);
    ok = ok && (proutes || !W);
    int tk = j->sp.top_logprobs;
    for (r = 0; ok && r < RG->n; r++) {
        resp[r].tokens = malloc((size_t)maxt * sizeof(int));
        resp[r].logprobs = malloc((size_t)maxt * sizeof(float));
        ok = resp[r].tokens && resp[r].logprobs;
        if (ok && tk > 0) {
            resp[r].top_ids = malloc((size_t)maxt * tk * sizeof(int));
            resp[r].top_lps = malloc((size_t)maxt * tk * sizeof(float));
            ok = resp[r].top_ids && resp[r].top_lps;
        }
    }
    if (!ok) {
        for (r = 0; resp && r < RG->n; r++) {
            free(resp[r].tokens);
            free(resp[r].logprobs);
            free(resp[r].top_ids);
            free(resp[r].top_lps);
        }
        free(proutes);
        untake(s, pb, rb, RG->n);
        if (st0 >= 0) kvp_release(&s->spool, st0, RG->n + 1);
        free(G);
        free(st);
        free(resp);
        return err_set(GE_NOMEM, "scheduler: out of memory");
    }
    *G = (sgroup){.job = j,
                  .g = g,
                  .prompt0 = pb->start,
                  .pblk = pb,
                  .cached = m,
                  .st0 = st0,
                  .P = RG->P,
                  .n = RG->n,
                  .n_live = RG->n,
                  .fresh = 1,
                  .st = st};
    j->out[g] = (eng_group_result){.resp = resp, .n = RG->n, .cached_tokens = m, .prompt_routes = proutes};
    if (st0 >= 0) model_kv_state_set(eng_dec_model(s->e), &s->kv, st0, -1); /* the prompt starts with no history */
    for (r = 0; r < RG->n; r++) {
        /* the stream seed of (request seed, group index, response index), as it always was;
         * the group index is its place in the original request when the caller split it */
        int gi = j->sp.group_index ? j->sp.group_index[g] : g;
        st[r] = (stream){.grp = G,
                         .idx = r,
                         .base = rb[r]->start,
                         .blk = rb[r],
                         .out = &resp[r],
                         .rng = j->sp.seed ^ ((uint64_t)(gi + 1) * 0xD1B54A32D192ED03ULL) ^ ((uint64_t)(r + 1) << 32)};
        splitmix(&st[r].rng);
        if (j->gram) jg_start(j->gram, &st[r].gs);
    }
    free(rb);
    s->live[s->n_live++] = G;
    s->running += RG->n;
    j->live_groups++;
    return 1;
}

/* A group of max_tokens 0 completes at once with empty responses and takes no rows. */
static int empty_group(eng_sched *s, eng_sched_job *j, int g) {
    int n = j->groups[g].n;
    eng_response *resp = calloc((size_t)(n ? n : 1), sizeof *resp);
    if (!resp) return err_set(GE_NOMEM, "scheduler: out of memory");
    j->out[g] = (eng_group_result){.resp = resp, .n = n};
    for (int r = 0; r < n; r++) {
        resp[r].finish = FINISH_LENGTH;
        if (s->e->tok) {
            int rc = tok_decode(s->e->tok, NULL, 0, 1, &resp[r].text, &resp[r].text_len);
            if (rc) return rc;
        }
    }
    return 0;
}

/* Admits waiting groups in FIFO order until one does not fit (it then blocks the rest) or the
 * step's prefill / running limits are reached. */
static void admit(eng_sched *s) {
    int prefill_T = 0, admitted = 0;
    if (s->pfx.epoch != s->e->weights_epoch) { /* the weights changed: their K/V are not these */
        pfx_clear(&s->pfx, &s->pool);
        s->pfx.epoch = s->e->weights_epoch;
    }
    for (eng_sched_job *j = s->jobs; j; j = j->next) {
        while (!j->state && j->next_group < j->n_groups) {
            int g = j->next_group, rc;
            const eng_rollout_group *RG = &j->groups[g];
            if (j->sp.max_tokens <= 0) {
                if ((rc = empty_group(s, j, g))) {
                    job_stop(s, j, rc, err_msg());
                    break;
                }
                j->next_group++;
                continue;
            }
            if (admitted && prefill_T + RG->P > s->max_prefill) return;
            if (s->running > 0 && s->running + RG->n > s->max_running) return;
            if (!s->kv.mem && (rc = kv_open(s))) {
                job_stop(s, j, rc, err_msg());
                break;
            }
            rc = admit_group(s, j, g);
            if (rc == 0) return;
            if (rc < 0) {
                job_stop(s, j, rc, err_msg());
                break;
            }
            j->next_group++;
            admitted++;
            prefill_T += RG->P;
        }
    }
}

/* ---------------------------------------------------------------- the step */

/* Row r of the call draws stream k's next token: its parameters, and a guided job's mask. */
static int set_row(eng_sched *s, int r, stream *k) {
    eng_sched_job *j = k->grp->job;
    s->rp[r] = row_of(k);
    s->who[r] = k;
    s->top_at[r] = -1;
    if (j->sp.top_logprobs > 0) {
        s->top_at[r] = s->n_top;
        s->top_rows[s->n_top++] = r;
        if (j->sp.top_logprobs > s->top_k) s->top_k = j->sp.top_logprobs;
    }
    if (!j->gram) return 0;
    int a = gd_row(s->e, &s->masks, j->gram, &k->gs, j->sp.max_tokens - k->out->n_tokens, job_ban(j), j->n_ban);
    if (a < 0) {
        job_stop(s, j, a, err_msg());
        return a;
    }
    s->rp[r].allow = a;
    return 0;
}

/* Every row carries its own draw parameters and key (sample_params), so all of a step's rows share
 * one dec_step; the only split left is the ban list, one per call: a row that bans (min_tokens
 * not reached) joins a call whose list is unset or equal to its job's. *ban is the job whose
 * list the call carries (NULL: none yet). */
static int row_bans(const stream *k) { return k->out->n_tokens < k->grp->job->sp.min_tokens; }
static int joins(const eng_sched_job **ban, const stream *k) {
    if (!row_bans(k)) return 1;
    const eng_sched_job *x = k->grp->job, *y = *ban;
    if (!y) {
        *ban = x;
        return 1;
    }
    return x == y || (x->n_ban == y->n_ban && !memcmp(job_ban(x), job_ban(y), (size_t)x->n_ban * sizeof(int)));
}

static int alive(const stream *k) { return !k->done && !k->grp->job->state; }

/* Runs one dec_step over in (T tokens) drawing R rows for s->who; on failure every job in
 * the call fails. */
static int run_call(eng_sched *s, const model_input *in, int R, const eng_sched_job *ban) {
    s->dec_calls++;
    dec_top top = {s->n_top, s->top_k, s->top_rows, s->top_ids, s->top_lps};
    int rc = dec_step(s->e, &s->kv, in, R, s->rows, s->rp, ban ? job_ban(ban) : NULL, ban ? ban->n_ban : 0, s->masks.m,
                      s->masks.n, s->n_top ? &top : NULL, s->ids, s->lps, s->rt.W ? s->rt.buf : NULL);
    int K = s->top_k;
    s->masks.n = s->n_top = s->top_k = 0;
    if (!rc) rt_scatter(&s->rt, in->T);
    if (rc) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s", err_msg());
        for (int i = 0; i < R; i++) job_stop(s, s->who[i]->grp->job, rc, msg);
        return rc;
    }
    for (int i = 0; i < R; i++) {
        int t = s->top_at[i];
        record_token(s, s->who[i], s->ids[i], s->lps[i], t < 0 ? NULL : s->top_ids + (size_t)t * K,
                     t < 0 ? NULL : s->top_lps + (size_t)t * K);
    }
    return 0;
}

/* Prefill of the fresh groups: each prompt once (from its first id not copied from the prefix
 * cache), causal on itself, then every response's first token drawn from its prompt's last row. */
static int prefill(eng_sched *s) {
    int n = 0, T = 0, R = 0, rc = 0;
    for (int i = 0; i < s->n_live; i++)
        if (s->live[i]->fresh) {
            n++;
            T += s->live[i]->P - s->live[i]->cached;
            R += s->live[i]->n;
        }
    if (!n) return 0;
    if ((rc = reserve(s, T, R, n))) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s", err_msg());
        for (int i = 0; i < s->n_live; i++)
            if (s->live[i]->fresh) job_stop(s, s->live[i]->job, rc, msg);
        return rc;
    }
    n = 0;
    for (int i = 0; i < s->n_live; i++)
        if (s->live[i]->fresh) {
            s->items[n] = s->live[i];
            s->taken[n++] = 0;
            s->live[i]->fresh = 0;
        }
    int *ints = s->ints, cT = s->cap_T;
    int *tok = ints, *pos = ints + cT, *a0 = ints + 2 * cT, *a1 = ints + 3 * cT, *b0 = ints + 4 * cT, *b1 = ints + 5 * cT,
        *slot = ints + 6 * cT, *srow = ints + 7 * cT;
    for (int first = 0; first < n; first++) {
        if (s->taken[first]) continue;
        sgroup *lead = s->items[first];
        if (lead->dead || lead->job->state) continue;
        int t = 0, r = 0, err = 0;
        const eng_sched_job *ban = NULL;
        for (int i = first; i < n; i++) {
            sgroup *G = s->items[i];
            if (s->taken[i] || G->dead || G->job->state || !joins(&ban, &G->st[0])) continue;
            s->taken[i] = 1;
            for (int p = G->cached; p < G->P; p++, t++) {
                tok[t] = G->job->groups[G->g].prompt[p];
                if (s->rt.W) s->rt.dst[t] = G->job->out[G->g].prompt_routes + (size_t)p * s->rt.W;
                pos[t] = p;
                slot[t] = G->prompt0 + p;
                srow[t] = G->st0;
                a0[t] = G->prompt0;
                a1[t] = G->prompt0 + p + 1;
                b0[t] = b1[t] = 0;
            }
            for (int k = 0; k < G->n; k++, r++) {
                s->rows[r] = t - 1;
                set_row(s, r, &G->st[k]); /* on failure its job stopped: the row's draw is ignored */
            }
        }
        if (!t) continue;
        model_input in = {
            .T = t, .tokens = tok, .pos = pos, .a0 = a0, .a1 = a1, .b0 = b0, .b1 = b1, .slot = slot, .srow = s->cap_st ? srow : NULL};
        if ((err = run_call(s, &in, r, ban)) && !rc) rc = err;
        for (int i = 0; !err && s->cap_st && i < r; i++) /* each live response starts from its prompt's state */
            if (alive(s->who[i]))
                model_kv_state_set(eng_dec_model(s->e), &s->kv, s->who[i]->grp->st0 + 1 + s->who[i]->idx, s->who[i]->grp->st0);
    }
    return rc;
}

/* Decode: every live response feeds its last token and draws its next. */
static int decode(eng_sched *s) {
    int n = 0, rc = 0;
    if ((rc = reserve(s, s->running, s->running, s->running))) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s", err_msg());
        for (int i = 0; i < s->n_live; i++) job_stop(s, s->live[i]->job, rc, msg);
        return rc;
    }
    for (int i = 0; i < s->n_live; i++) {
        sgroup *G = s->live[i];
        for (int k = 0; k < G->n; k++)
            if (alive(&G->st[k]) && G->st[k].out->n_tokens > 0) {
                s->items[n] = &G->st[k];
                s->taken[n++] = 0;
            }
    }
    int *ints = s->ints, cT = s->cap_T;
    int *tok = ints, *pos = ints + cT, *a0 = ints + 2 * cT, *a1 = ints + 3 * cT, *b0 = ints + 4 * cT, *b1 = ints + 5 * cT,
        *slot = ints + 6 * cT, *srow = ints + 7 * cT;
    for (int first = 0; first < n; first++) {
        if (s->taken[first]) continue;
        stream *lead = s->items[first];
        if (!alive(lead)) continue;
        int B = 0, err;
        const eng_sched_job *ban = NULL;
        for (int i = first; i < n; i++) {
            stream *x = s->items[i];
            if (s->taken[i] || !alive(x) || !joins(&ban, x)) continue;
            s->taken[i] = 1;
            int m = x->out->n_tokens;
            sgroup *G = x->grp;
            tok[B] = x->out->tokens[m - 1];
            if (s->rt.W) s->rt.dst[B] = rt_row(&x->out->routes, &x->rcap, m - 1, s->rt.W);
            pos[B] = G->P + m - 1;
            slot[B] = x->base + m - 1;
            a0[B] = G->prompt0;
            a1[B] = G->prompt0 + G->P;
            b0[B] = x->base;
            b1[B] = x->base + m;
            srow[B] = G->st0 + 1 + x->idx;
            s->rows[B] = B;
            set_row(s, B, x);
            B++;
        }
        if (!B) continue;
        model_input d = {
            .T = B, .tokens = tok, .pos = pos, .a0 = a0, .a1 = a1, .b0 = b0, .b1 = b1, .slot = slot, .srow = s->cap_st ? srow : NULL};
        if ((err = run_call(s, &d, B, ban)) && !rc) rc = err;
    }
    return rc;
}

int eng_sched_step(eng_sched *s) {
    admit(s);
    int rc = prefill(s), rc2 = decode(s);
    if (rc2 && !rc) rc = rc2;
    s->steps++;
    sweep(s);
    return rc;
}

/* ---------------------------------------------------------------- jobs */

int eng_sched_add(eng_sched *s, const eng_rollout_group *groups, int n_groups, const eng_sampling *sp, eng_group_result *out,
                  eng_sched_job **job) {
    *job = NULL;
    memset(out, 0, (size_t)n_groups * sizeof *out);
    eng_sched_job *j = calloc(1, sizeof *j);
    if (!j) return err_set(GE_NOMEM, "scheduler: out of memory");
    *j = (eng_sched_job){.groups = groups, .n_groups = n_groups, .sp = *sp, .out = out};
    for (int g = 0; g < n_groups; g++) {
        if (s->cap_st && groups[g].n + 1 > s->cap_st) {
            free(j);
            return err_set(GE_TOO_LARGE,
                           "rollout group %d needs %d recurrent-state rows (n %d + its prompt) but the pool holds %d (%.0f MiB); "
                           "lower n, or raise the KV budget",
                           g, groups[g].n + 1, groups[g].n, s->cap_st, s->cap_st * (double)s->st_bytes / 1048576.0);
        }
        if (!job_rows_fit(s, j, g)) {
            long long need = eng_sched_rows_needed(&groups[g], sp);
            free(j);
            return err_set(GE_TOO_LARGE,
                           "rollout group %d needs %lld KV rows (prompt %d + n %d x max_tokens %d) but the KV pool holds "
                           "%d rows (%.0f MiB); lower n or max_tokens, or raise the KV budget",
                           g, need, groups[g].P, groups[g].n, sp->max_tokens, s->cap, s->cap * (double)s->row_bytes / 1048576.0);
        }
        j->tok_total += (long long)groups[g].n * (sp->max_tokens > 0 ? sp->max_tokens : 0);
    }
    int n_ban = (sp->ignore_eos ? 0 : s->info.n_eos) + sp->n_stop_token_ids, rc;
    int *ban = j->ban;
    if (n_ban > (int)(sizeof j->ban / sizeof j->ban[0]) && !(ban = j->ban_heap = malloc((size_t)n_ban * sizeof(int)))) {
        free(j);
        return err_set(GE_NOMEM, "scheduler: out of memory");
    }
    if ((rc = gd_spec_of(s->e, sp->guided, sp->n_guided_suffix ? sp->guided_suffix[0] : NULL, sp->guided_schema, &j->gram))) {
        free(j->ban_heap);
        free(j);
        return rc;
    }
    if (!sp->ignore_eos)
        for (int i = 0; i < s->info.n_eos; i++) ban[j->n_ban++] = s->info.eos_ids[i];
    for (int i = 0; i < sp->n_stop_token_ids; i++) ban[j->n_ban++] = sp->stop_token_ids[i];
    if (s->jobs_tail) s->jobs_tail->next = j;
    else s->jobs = j;
    s->jobs_tail = j;
    *job = j;
    return 0;
}

int eng_sched_busy(const eng_sched *s) {
    if (s->n_live) return 1;
    for (const eng_sched_job *j = s->jobs; j; j = j->next)
        if (!j->state && j->next_group < j->n_groups) return 1;
    return 0;
}

int eng_sched_can_admit(const eng_sched *s) {
    for (const eng_sched_job *j = s->jobs; j; j = j->next)
        if (!j->state && j->next_group < j->n_groups) return 0;
    return 1;
}

void eng_sched_get_stats(const eng_sched *s, eng_sched_stats *st) {
    memset(st, 0, sizeof *st);
    for (const eng_sched_job *j = s->jobs; j; j = j->next) {
        st->jobs++;
        if (!j->state) st->waiting_groups += j->n_groups - j->next_group;
    }
    for (int i = 0; i < s->n_live; i++) st->running_groups += !s->live[i]->dead;
    st->running_responses = s->running;
    for (int i = 0; i < s->n_live; i++) { /* rows of admitted groups; the rest only the cache holds */
        const sgroup *G = s->live[i];
        if (G->dead) continue;
        st->rows_used += G->P;
        for (int k = 0; k < G->n; k++) st->rows_used += G->st[k].done ? 0 : G->job->sp.max_tokens;
    }
    st->prefix_rows = s->pool.used - st->rows_used;
    st->rows_cap = s->cap;
    st->row_bytes = s->row_bytes;
    st->state_rows_used = s->cap_st ? s->spool.used : 0;
    st->state_rows_cap = s->cap_st;
    st->state_row_bytes = s->st_bytes;
    st->steps = s->steps;
    st->dec_calls = s->dec_calls;
    st->prefix_entries = s->pfx.n;
    st->prefix_hits = s->pfx.hits;
    st->prefix_hit_tokens = s->pfx.hit_tokens;
    st->prefix_query_tokens = s->pfx.query_tokens;
    st->prefix_evicted = s->pfx.evicted;
}

int eng_sched_job_state(const eng_sched_job *j, double *progress, int *started, const char **msg) {
    if (progress) *progress = j->state == 1 ? 1.0 : j->tok_total ? (double)j->tok_done / (double)j->tok_total : 0;
    if (started) *started = j->next_group > 0;
    if (msg) *msg = j->state < 0 ? j->msg : "";
    return j->state;
}

void eng_sched_job_release(eng_sched *s, eng_sched_job *j) {
    if (!j->state) job_stop(s, j, GE_CONFLICT, "cancelled");
    sweep(s);
    eng_sched_job **pp = &s->jobs, *prev = NULL;
    while (*pp && *pp != j) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    if (*pp) {
        *pp = j->next;
        if (s->jobs_tail == j) s->jobs_tail = prev;
    }
    free(j->ban_heap);
    gd_spec_free(j->gram);
    free(j);
}

void eng_sched_close(eng_sched *s) {
    if (!s) return;
    while (s->jobs) eng_sched_job_release(s, s->jobs);
    pfx_destroy(&s->pfx, &s->pool);
    if (s->kv.mem) model_kv_free(eng_dec_model(s->e), &s->kv);
    kvp_destroy(&s->pool);
    if (s->cap_st) kvp_destroy(&s->spool);
    if (s->e->sched == s) s->e->sched = NULL;
    free(s->live);
    free(s->ints);
    free(s->rows);
    free(s->ids);
    free(s->lps);
    free(s->rp);
    free(s->who);
    free(s->top_rows);
    free(s->top_ids);
    free(s->top_lps);
    free(s->items);
    free(s->taken);
    rt_free(&s->rt);
    gd_masks_free(&s->masks);
    free(s);
}

/* ---------------------------------------------------------------- eng_rollout */

/* A scheduler for one request: the default pools, but no larger than the request needs. */
static int open_for(eng *e, const eng_rollout_group *groups, int n_groups, const eng_sampling *sp, eng_sched **out) {
    long long need = 0, need_st = 0;
    for (int g = 0; g < n_groups; g++) {
        need += eng_sched_rows_needed(&groups[g], sp);
        need_st += sp->max_tokens > 0 ? groups[g].n + 1 : 0;
    }
    eng_sched_opts o = {0};
    int rc = eng_sched_open(e, &o, out);
    if (rc) return rc;
    eng_sched *s = *out;
    if (need > 0 && need < s->cap) {
        kvp_destroy(&s->pool);
        s->cap = (int)need;
        rc = kvp_init(&s->pool, s->cap);
    }
    if (!rc && need_st > 0 && need_st < s->cap_st) {
        kvp_destroy(&s->spool);
        s->cap_st = (int)need_st;
        rc = kvp_init(&s->spool, s->cap_st);
    }
    if (rc) {
        eng_sched_close(s);
        *out = NULL;
    }
    return rc;
}

int eng_rollout(eng *e, const eng_rollout_group *groups, int n_groups, const eng_sampling *sp, eng_group_result *out,
                eng_progress_cb cb, void *ud) {
    eng_sched *s;
    eng_sched_job *j = NULL;
    memset(out, 0, (size_t)n_groups * sizeof *out);
    int rc = open_for(e, groups, n_groups, sp, &s);
    if (rc) return rc;
    if ((rc = eng_sched_add(s, groups, n_groups, sp, out, &j))) goto done;
    double progress;
    const char *msg;
    while (!(rc = eng_sched_job_state(j, &progress, NULL, &msg))) {
        eng_sched_step(s);
        if (cb) cb(ud, progress);
    }
    if (rc < 0) err_set(rc, "%s", msg);
    else rc = 0;
done:
    if (j) eng_sched_job_release(s, j);
    eng_sched_close(s);
    if (rc)
        for (int g = 0; g < n_groups; g++) eng_group_result_free(&out[g]);
    return rc;
}
