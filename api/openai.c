/* openai.c — OpenAI-compatible serving of the live policy: POST /v1/completions and
 * POST /v1/chat/completions, for eval harnesses, agent frameworks and SDK clients pointed at the
 * policy being trained: their jobs and their replies.
 *
 * A request becomes ordinary jobs, so it runs in the same continuous-batching scheduler as the
 * rollouts and in FIFO order with the updates (it samples one policy version, reported as
 * policy_version): the OpenAI fields are read and rewritten as a native rollout request by
 * openai_request.c (the chat prompt by openai_chat.c); the connection is suspended until the job
 * ends (as POST /v1/logprobs does). echo with logprobs (how harnesses score a text's likelihood,
 * max_tokens 0 or 1) adds a logprobs job over prompt + completion, so those numbers are exactly
 * POST /v1/logprobs's; the first token has none. logprobs also carry token_ids (a token's text
 * can be part of a character); top_logprobs come from that scoring job too. A chat answer under
 * tool_choice auto is parsed into tool_calls (openai_tools.c); under required or a named
 * function it opens with the call (its opening joins the prompt, the arguments are decoded under
 * a JSON grammar: sampling.guided), and required over several
 * tools first runs a logprobs job over each tool's opening to draw the name (choose). stream:
 * true is answered token by token by openai_stream.c, except echo with logprobs (it scores a
 * given text): its events are written here once the jobs are done.
 *
 * Not here: the native routes (handlers.c), the router (router.c) and replies (reply.c). */
#include "api/internal.h"
#include "api/openai.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/fields.h"
#include "api/params.h"
#include "common/clock.h"
#include "common/err.h"

void oa_req_free(void *p) {
    oa_req *q = p;
    if (!q) return;
    json_object_put(q->rollout);
    json_object_put(q->sampled);
    json_object_put(q->scored);
    json_object_put(q->cands);
    free(q->forced);
    free(q->forced_name);
    free(q);
}

/* ---------------------------------------------------------------- jobs */

json_object *oa_prompt_ids(const oa_req *q, int i) {
    return json_object_object_get(json_object_array_get_idx(json_object_object_get(q->rollout, "groups"), (size_t)i), "prompt_ids");
}
json_object *oa_response(const oa_req *q, int i, int k) {
    if (!q->sampled) return NULL;
    json_object *g = json_object_array_get_idx(json_object_object_get(q->sampled, "groups"), (size_t)i);
    return json_object_array_get_idx(json_object_object_get(g, "responses"), (size_t)k);
}

/* echo + logprobs: one logprobs group per prompt, prompt = its first token, responses = the rest
 * followed by each completion. NULL when there is nothing to score (one token, nothing sampled). */
static json_object *scoring_request(const oa_req *q) {
    json_object *req = json_object_new_object(), *gs = json_object_new_array();
    json_object_object_add(req, "groups", gs);
    int any = 0;
    for (int i = 0; i < q->n_prompts; i++) {
        json_object *pid = oa_prompt_ids(q, i), *g = json_object_new_object(), *rs = json_object_new_array();
        int P = (int)json_object_array_length(pid);
        json_object *first = json_object_new_array();
        json_object_array_add(first, json_object_new_int(json_object_get_int(json_object_array_get_idx(pid, 0))));
        json_object_object_add(g, "prompt_ids", first);
        json_object_object_add(g, "responses", rs);
        for (int k = 0; k < q->n; k++) {
            json_object *ids = json_object_new_array(), *r = json_object_new_object(), *resp = oa_response(q, i, k);
            for (int t = 1; t < P; t++) json_object_array_add(ids, json_object_get(json_object_array_get_idx(pid, (size_t)t)));
            json_object *gen = resp ? json_object_object_get(resp, "token_ids") : NULL;
            for (size_t t = 0; gen && t < json_object_array_length(gen); t++)
                json_object_array_add(ids, json_object_get(json_object_array_get_idx(gen, t)));
            if (json_object_array_length(ids) == 0) json_object_array_add(ids, json_object_new_int(0)); /* unused */
            else any = 1;
            json_object_object_add(r, "token_ids", ids);
            json_object_array_add(rs, r);
        }
        json_object_array_add(gs, g);
    }
    if (q->logprobs > 0) api_put_int(req, "top_logprobs", q->logprobs);
    /* the sampled tokens' distribution (logits / T, T = 1 when greedy); echo scores at T = 1 */
    double T = json_object_get_double(json_object_object_get(json_object_object_get(q->rollout, "sampling"), "temperature"));
    if (!q->echo && T > 0) api_put_num(req, "temperature", T);
    if (!any) {
        json_object_put(req);
        return NULL;
    }
    return req;
}

/* The job x->job_id ended (or is still pending: 1 with the connection suspended). 0 with *result
 * (the job's result object) or a reply sent (*r, returns -1). */
static int job_result(api_server *s, struct MHD_Connection *c, api_req *x, json_object **result, long long *pv, enum MHD_Result *r) {
    store *st = api_pool_get(s);
    if (!st) {
        *r = api_reply_fail(c, x, GE_STORE, "", "cannot open the store");
        return -1;
    }
    store_job j = {0};
    int rc = store_get(st, x->job_id, &j);
    int pending = !rc && (j.status == JOB_QUEUED || j.status == JOB_RUNNING);
    store_job_clear(&j);
    if (pending && api_wait_suspend(s, c, x, st, x->job_id)) {
        api_pool_put(s, st);
        *r = MHD_YES;
        return 1;
    }
    rc = store_get(st, x->job_id, &j);
    api_pool_put(s, st);
    if (rc) {
        *r = api_reply_fail(c, x, GE_STORE, "", "cannot read job: %s", err_msg());
        return -1;
    }
    int ret = -1;
    if (j.status == JOB_DONE && j.result) {
        *result = json_tokener_parse(j.result);
        *pv = j.policy_version;
        ret = *result ? 0 : -1;
        if (ret) *r = api_reply_fail(c, x, GE_INTERNAL, "", "job %s has an unreadable result", j.id);
    } else if (j.status == JOB_FAILED || j.status == JOB_CANCELLED) {
        *r = api_reply_job_error(c, x, &j);
    } else {
        *r = api_reply_fail(c, x, GE_UNAVAILABLE, "", "job %s did not finish in time (it goes on; GET /v1/jobs/%s)", j.id, j.id);
    }
    store_job_clear(&j);
    return ret;
}

/* ---------------------------------------------------------------- reply */

/* The text of one token (invalid UTF-8 of a cut character becomes U+FFFD). */
static char *token_text(eng *e, int id) {
    char *t = NULL;
    size_t len = 0;
    if (eng_detokenize(e, &id, 1, 0, &t, &len)) {
        err_clear();
        return strdup("");
    }
    size_t sl;
    char *clean = api_utf8_sanitize(t ? t : "", t ? len : 0, &sl);
    free(t);
    return clean ? clean : strdup("");
}

/* The text of ids (special tokens skipped when skip); "" when it cannot be decoded. */
char *oa_ids_text(eng *e, json_object *ids, int skip) {
    int n = (int)json_object_array_length(ids);
    int *v = malloc(sizeof *v * (size_t)(n ? n : 1));
    char *t = NULL, *clean = NULL;
    size_t len = 0, sl;
    if (!v) return strdup("");
    for (int i = 0; i < n; i++) v[i] = json_object_get_int(json_object_array_get_idx(ids, (size_t)i));
    if (!eng_detokenize(e, v, n, skip, &t, &len)) clean = api_utf8_sanitize(t ? t : "", t ? len : 0, &sl);
    else err_clear();
    free(t);
    free(v);
    return clean ? clean : strdup("");
}

/* Token t's alternatives from the scoring job (NULL when it has none): the array of k ids and
 * the array of their logprobs. */
static json_object *top_at(const oa_tops *tp, long t, json_object **lps) {
    json_object *ids = tp && tp->ids && t + tp->from >= 0 ? json_object_array_get_idx(tp->ids, (size_t)(t + tp->from)) : NULL;
    *lps = ids ? json_object_array_get_idx(tp->lps, (size_t)(t + tp->from)) : NULL;
    return *lps ? ids : NULL;
}

/* Completions' top_logprobs entry {text: logprob}: the alternatives (past V: -1, skipped), and
 * the chosen token as OpenAI adds it when it is not among them. */
static json_object *completion_top(eng *e, const oa_tops *tp, long t, const char *chosen, double lp) {
    json_object *one = json_object_new_object(), *tl, *ti = top_at(tp, t, &tl);
    for (size_t k = 0; ti && k < json_object_array_length(ti); k++) {
        int id = json_object_get_int(json_object_array_get_idx(ti, k));
        if (id < 0) continue;
        char *s = token_text(e, id);
        if (!json_object_object_get_ex(one, s, NULL))
            json_object_object_add(one, s, json_object_new_double(json_object_get_double(json_object_array_get_idx(tl, k))));
        free(s);
    }
    if (!json_object_object_get_ex(one, chosen, NULL)) json_object_object_add(one, chosen, json_object_new_double(lp));
    return one;
}

/* Completions logprobs {tokens, token_logprobs, top_logprobs, text_offset} over ids with their
 * logprobs (lps may be shorter at the front: the echoed first token has none). */
json_object *oa_completion_logprobs(eng *e, json_object *ids, json_object *lps, int lp_offset, size_t offset0, const oa_tops *tp) {
    json_object *o = json_object_new_object(), *tk = json_object_new_array(), *tl = json_object_new_array(),
                *top = json_object_new_array(), *off = json_object_new_array();
    size_t at = offset0;
    for (size_t t = 0; t < json_object_array_length(ids); t++) {
        char *s = token_text(e, json_object_get_int(json_object_array_get_idx(ids, t)));
        json_object_array_add(tk, json_object_new_string(s));
        long li = (long)t - lp_offset;
        json_object *v = li >= 0 ? json_object_array_get_idx(lps, (size_t)li) : NULL;
        if (v) {
            json_object_array_add(tl, json_object_new_double(json_object_get_double(v)));
            json_object_array_add(top, completion_top(e, tp, li, s, json_object_get_double(v)));
        } else {
            json_object_array_add(tl, NULL);
            json_object_array_add(top, NULL);
        }
        json_object_array_add(off, json_object_new_int64((long long)at));
        for (const unsigned char *p = (const unsigned char *)s; *p; p++) at += (*p & 0xC0) != 0x80; /* characters */
        free(s);
    }
    json_object_object_add(o, "tokens", tk);
    json_object_object_add(o, "token_logprobs", tl);
    json_object_object_add(o, "top_logprobs", top);
    json_object_object_add(o, "text_offset", off);
    api_put_copy(o, "token_ids", ids); /* grpod's addition: token strings can be cut UTF-8 */
    return o;
}

static json_object *chat_entry(const char *s, double lp) {
    json_object *c = json_object_new_object(), *bytes = json_object_new_array();
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) json_object_array_add(bytes, json_object_new_int(*p));
    api_put_str(c, "token", s);
    json_object_object_add(c, "logprob", json_object_new_double(lp));
    json_object_object_add(c, "bytes", bytes);
    return c;
}

/* Chat logprobs {"content": [{token, logprob, bytes, top_logprobs}]} of the sampled tokens. */
json_object *oa_chat_logprobs(eng *e, json_object *ids, json_object *lps, const oa_tops *tp) {
    json_object *o = json_object_new_object(), *a = json_object_new_array();
    for (size_t t = 0; t < json_object_array_length(ids); t++) {
        char *s = token_text(e, json_object_get_int(json_object_array_get_idx(ids, t)));
        double lp = json_object_get_double(json_object_array_get_idx(lps, t));
        json_object *c = chat_entry(s, lp), *top = json_object_new_array(), *tl, *ti = top_at(tp, (long)t, &tl);
        for (size_t k = 0; ti && k < json_object_array_length(ti); k++) {
            int id = json_object_get_int(json_object_array_get_idx(ti, k));
            if (id < 0) continue;
            char *a = token_text(e, id);
            json_object_array_add(top, chat_entry(a, json_object_get_double(json_object_array_get_idx(tl, k))));
            free(a);
        }
        if (!ti) json_object_array_add(top, chat_entry(s, lp)); /* no alternatives computed: the chosen one */
        json_object_object_add(c, "top_logprobs", top);
        json_object_array_add(a, c);
        free(s);
    }
    json_object_object_add(o, "content", a);
    return o;
}

/* A sampled response's text: the rollout's (special tokens skipped, cut before a stop string)
 * unless the request keeps special tokens (skip_special_tokens false) or the stop string
 * (include_stop_str_in_output): then decoded again from its ids and cut as the engine cuts. */
char *oa_response_text(eng *e, const oa_req *q, json_object *resp) {
    const char *t = json_object_get_string(json_object_object_get(resp, "text"));
    if (q->skip_special && !q->include_stop) return strdup(t ? t : "");
    char *text = oa_ids_text(e, json_object_object_get(resp, "token_ids"), q->skip_special);
    if (!text) return NULL;
    json_object *stops = json_object_object_get(json_object_object_get(q->rollout, "sampling"), "stop");
    const char *fin = json_object_get_string(json_object_object_get(resp, "finish_reason"));
    for (size_t k = 0; fin && !strcmp(fin, "stop") && k < json_object_array_length(stops); k++) {
        const char *st = json_object_get_string(json_object_array_get_idx(stops, k));
        char *hit = st && *st ? strstr(text, st) : NULL;
        if (hit) {
            hit[q->include_stop ? strlen(st) : 0] = 0;
            break;
        }
    }
    return text;
}

json_object *oa_answer_calls(const oa_req *q, const char *text, size_t *content_len) {
    int max = q->parallel_tool_calls ? 0 : 1;
    if (q->forced) {
        *content_len = 0;
        return oa_forced_calls(q->tool_format, q->forced, q->forced_name, text, max);
    }
    return q->tool_choice == OA_TOOLS_AUTO ? oa_parse_tool_calls(q->tool_format, text, content_len, max) : NULL;
}

/* A chat message {"role", "content", "tool_calls"}: the model's calls (oa_answer_calls; *called
 * set), the text before them the content (null when empty). */
static json_object *chat_message(const oa_req *q, const char *text, int *called) {
    json_object *m = json_object_new_object();
    size_t clen = strlen(text);
    json_object *calls = oa_answer_calls(q, text, &clen);
    *called = calls != NULL;
    api_put_str(m, "role", "assistant");
    json_object_object_add(m, "content", calls && !clen ? NULL : json_object_new_string_len(text, (int)clen));
    json_object_object_add(m, "tool_calls", calls ? calls : json_object_new_array());
    return m;
}

/* The scoring job's alternatives of prompt i's response k; token t of the scored sequence (the
 * prompt after its first token, then the completion) at index t + from. */
static oa_tops scored_tops(const oa_req *q, int i, int k, int from) {
    if (!q->scored) return (oa_tops){0};
    json_object *sg = json_object_array_get_idx(json_object_object_get(q->scored, "groups"), (size_t)i);
    json_object *r = json_object_array_get_idx(json_object_object_get(sg, "responses"), (size_t)k);
    return (oa_tops){json_object_object_get(r, "top_ids"), json_object_object_get(r, "top_logprobs"), from};
}

/* One choice: {"index", "text" | "message", "logprobs", "finish_reason"}; counts tokens into *ct. */
static json_object *choice(eng *e, const oa_req *q, int i, int k, long long *ct) {
    json_object *ch = json_object_new_object(), *resp = oa_response(q, i, k);
    json_object *gen = resp ? json_object_object_get(resp, "token_ids") : NULL;
    char *gen_text = resp ? oa_response_text(e, q, resp) : strdup("");
    const char *fin = resp ? json_object_get_string(json_object_object_get(resp, "finish_reason")) : "length";
    *ct += gen ? (long long)json_object_array_length(gen) : 0;
    api_put_int(ch, "index", (long long)i * q->n + k);
    if (q->chat) {
        int called;
        json_object_object_add(ch, "message", chat_message(q, gen_text ? gen_text : "", &called));
        if (called) fin = "tool_calls";
        int P = (int)json_object_array_length(oa_prompt_ids(q, i));
        oa_tops tp = scored_tops(q, i, k, P - 1); /* the completion follows the prompt's P - 1 */
        json_object_object_add(ch, "logprobs",
                               q->logprobs >= 0 && gen ? oa_chat_logprobs(e, gen, json_object_object_get(resp, "logprobs"), &tp)
                                                       : NULL);
    } else {
        json_object *pid = oa_prompt_ids(q, i);
        char *ptext = q->echo ? oa_ids_text(e, pid, 0) : strdup("");
        api_sbuf b = {0};
        api_sb_str(&b, ptext ? ptext : "");
        api_sb_str(&b, gen_text ? gen_text : "");
        api_put_str(ch, "text", b.p ? b.p : "");
        free(b.p);
        json_object *lp = NULL;
        if (q->logprobs >= 0 && q->echo) {
            json_object *all = json_object_new_array();
            for (size_t t = 0; t < json_object_array_length(pid); t++)
                json_object_array_add(all, json_object_get(json_object_array_get_idx(pid, t)));
            for (size_t t = 0; gen && t < json_object_array_length(gen); t++)
                json_object_array_add(all, json_object_get(json_object_array_get_idx(gen, t)));
            json_object *lps = NULL;
            if (q->scored) {
                json_object *sg = json_object_array_get_idx(json_object_object_get(q->scored, "groups"), (size_t)i);
                lps = json_object_object_get(json_object_array_get_idx(json_object_object_get(sg, "responses"), (size_t)k),
                                             "logprobs");
            }
            oa_tops tp = scored_tops(q, i, k, 0);
            lp = oa_completion_logprobs(e, all, lps, 1, 0, &tp);
            json_object_put(all);
        } else if (q->logprobs >= 0 && gen) {
            oa_tops tp = scored_tops(q, i, k, (int)json_object_array_length(pid) - 1);
            lp = oa_completion_logprobs(e, gen, json_object_object_get(resp, "logprobs"), 0, 0, &tp);
        }
        json_object_object_add(ch, "logprobs", lp);
        free(ptext);
    }
    api_put_str(ch, "finish_reason", fin && *fin ? fin : "length");
    if (q->return_ids) { /* vLLM: completions carry the prompt's ids per choice, chat once (reply_choices) */
        if (!q->chat) api_put_copy(ch, "prompt_token_ids", oa_prompt_ids(q, i));
        json_object_object_add(ch, "token_ids", gen ? json_object_get(gen) : json_object_new_array());
    }
    free(gen_text);
    return ch;
}

json_object *oa_usage(const oa_req *q, long long completion) {
    long long p = 0;
    for (int i = 0; i < q->n_prompts; i++) p += (long long)json_object_array_length(oa_prompt_ids(q, i));
    json_object *u = json_object_new_object();
    api_put_int(u, "prompt_tokens", p);
    api_put_int(u, "completion_tokens", completion);
    api_put_int(u, "total_tokens", p + completion);
    /* the prompt ids the KV pool's prefix cache already held (the rollout's usage, as vLLM) */
    json_object *d = json_object_object_get(json_object_object_get(q->sampled, "usage"), "prompt_tokens_details");
    if (d) api_put_copy(u, "prompt_tokens_details", d);
    return u;
}

json_object *oa_envelope(const oa_req *q, const char *id, const char *object) {
    json_object *o = json_object_new_object();
    api_put_str(o, "id", id);
    api_put_str(o, "object", object);
    api_put_int(o, "created", q->created);
    api_put_str(o, "model", q->model);
    api_put_int(o, "policy_version", q->policy_version);
    return o;
}

json_object *oa_streamed_calls(json_object *calls) {
    json_object *sc = json_object_new_array();
    for (size_t t = 0; t < json_object_array_length(calls); t++) {
        json_object *one = json_object_new_object();
        api_put_int(one, "index", (long long)t);
        json_object_object_foreach(json_object_array_get_idx(calls, t), ck, cv) api_put_copy(one, ck, cv);
        json_object_array_add(sc, one);
    }
    return sc;
}

void oa_sse(api_sbuf *b, json_object *o) {
    api_sb_str(b, "data: ");
    api_sb_str(b, json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
    api_sb_str(b, "\n\n");
    json_object_put(o);
}

static enum MHD_Result reply_choices(api_server *s, struct MHD_Connection *c, api_req *x, const oa_req *q) {
    eng *e = atomic_load(&s->engine);
    const char *id = q->id;
    long long ct = 0;
    json_object *choices = json_object_new_array();
    for (int i = 0; i < q->n_prompts; i++)
        for (int k = 0; k < q->n; k++) json_object_array_add(choices, choice(e, q, i, k, &ct));
    if (!q->stream) {
        json_object *o = oa_envelope(q, id, q->chat ? "chat.completion" : "text_completion");
        if (q->chat && q->return_ids) api_put_copy(o, "prompt_token_ids", oa_prompt_ids(q, 0));
        json_object_object_add(o, "choices", choices);
        json_object_object_add(o, "usage", oa_usage(q, ct));
        return api_reply_obj(c, x, 200, o);
    }
    /* server-sent events: per choice its content, then its finish_reason; usage; [DONE] */
    api_sbuf b = {0};
    const char *obj = q->chat ? "chat.completion.chunk" : "text_completion";
    for (size_t i = 0; i < json_object_array_length(choices); i++) {
        json_object *ch = json_object_array_get_idx(choices, i), *o = oa_envelope(q, id, obj), *a = json_object_new_array();
        json_object *d = json_object_new_object();
        api_put_copy(d, "index", json_object_object_get(ch, "index"));
        if (q->chat) {
            json_object *delta = json_object_new_object();
            json_object *msg = json_object_object_get(ch, "message"), *calls = json_object_object_get(msg, "tool_calls");
            api_put_str(delta, "role", "assistant");
            api_put_copy(delta, "content", json_object_object_get(msg, "content"));
            if (json_object_array_length(calls)) json_object_object_add(delta, "tool_calls", oa_streamed_calls(calls));
            json_object_object_add(d, "delta", delta);
        } else {
            api_put_copy(d, "text", json_object_object_get(ch, "text"));
        }
        json_object_object_add(d, "logprobs", json_object_get(json_object_object_get(ch, "logprobs")));
        json_object_object_add(d, "finish_reason", NULL);
        json_object_array_add(a, d);
        json_object_object_add(o, "choices", a);
        oa_sse(&b, o);
        o = oa_envelope(q, id, obj);
        a = json_object_new_array();
        d = json_object_new_object();
        api_put_copy(d, "index", json_object_object_get(ch, "index"));
        if (q->chat) json_object_object_add(d, "delta", json_object_new_object());
        else api_put_str(d, "text", "");
        json_object_object_add(d, "logprobs", NULL);
        api_put_copy(d, "finish_reason", json_object_object_get(ch, "finish_reason"));
        json_object_array_add(a, d);
        json_object_object_add(o, "choices", a);
        oa_sse(&b, o);
    }
    if (q->include_usage) {
        json_object *o = oa_envelope(q, id, obj);
        json_object_object_add(o, "choices", json_object_new_array());
        json_object_object_add(o, "usage", oa_usage(q, ct));
        oa_sse(&b, o);
    }
    api_sb_str(&b, "data: [DONE]\n\n");
    json_object_put(choices);
    if (b.oom) {
        free(b.p);
        return api_reply_fail(c, x, GE_NOMEM, "", "out of memory");
    }
    return api_reply_raw(c, x, 200, "text/event-stream; charset=utf-8", b.p, b.len, 1);
}

/* ---------------------------------------------------------------- handler */

/* A logprobs job follows the rollout: echo with logprobs scores the prompt, and logprobs > 0
 * (top_logprobs) lists each position's most likely tokens, which the sampler does not keep. */
static int scores(const oa_req *q) { return q->logprobs >= 0 && (q->echo || q->logprobs > 0); }

/* Submits sreq (taken) as a logprobs job: 1 with id set, or 0 with an error replied (*r). */
static int submit_logprobs(api_server *s, struct MHD_Connection *c, api_req *x, const oa_req *q, json_object *sreq, char *id,
                           enum MHD_Result *r) {
    api_model m;
    api_error e;
    json_object *payload = NULL;
    if (!api_engine_or_reply(s, c, x, &m, r)) {
        json_object_put(sreq);
        return 0;
    }
    api_limits l = api_limits_now(s);
    int rc = api_logprobs_or_reply(sreq, &l, &m, &payload, &e);
    json_object_put(sreq);
    if (rc) {
        oa_rename_field(&e, q->chat);
        *r = api_reply_error(c, x, &e);
        return 0;
    }
    *r = api_submit_and_reply(s, c, x, "logprobs", payload, id);
    json_object_put(payload);
    return id[0] != 0;
}

/* tool_choice required with several tools: one logprobs group, the prompt and each tool's call
 * opening as a response, at the rollout's temperature (1 when greedy). */
static json_object *choosing_request(const oa_req *q) {
    json_object *req = json_object_new_object(), *gs = json_object_new_array(), *g = json_object_new_object();
    json_object *rs = json_object_new_array();
    json_object_object_add(req, "groups", gs);
    api_put_copy(g, "prompt_ids", oa_prompt_ids(q, 0));
    json_object_object_add(g, "responses", rs);
    for (size_t i = 0; i < json_object_array_length(q->cands); i++) {
        json_object *r = json_object_new_object();
        api_put_copy(r, "token_ids", json_object_object_get(json_object_array_get_idx(q->cands, i), "ids"));
        json_object_array_add(rs, r);
    }
    json_object_array_add(gs, g);
    double T = json_object_get_double(json_object_object_get(json_object_object_get(q->rollout, "sampling"), "temperature"));
    if (T > 0) api_put_num(req, "temperature", T);
    return req;
}

/* The forced call drawn from the choosing job's result: tool i with probability exp(L_i) / Σ_j
 * exp(L_j), L_i the sum of its opening's logprobs at the temperature — the policy's own
 * distribution given that it opens one of the calls (greedy: the largest, ties the first). The
 * draw is the request's seed's (splitmix64), so a seeded request repeats. */
static int choose(oa_req *q, json_object *res) {
    json_object *rs = json_object_object_get(json_object_array_get_idx(json_object_object_get(res, "groups"), 0), "responses");
    json_object *samp = json_object_object_get(q->rollout, "sampling");
    int n = (int)json_object_array_length(q->cands), pick = 0;
    double top = -INFINITY, sum = 0, L[n > 0 ? n : 1];
    for (int i = 0; i < n; i++) {
        json_object *lps = json_object_object_get(json_object_array_get_idx(rs, (size_t)i), "logprobs");
        L[i] = 0;
        for (size_t t = 0; t < json_object_array_length(lps); t++)
            L[i] += json_object_get_double(json_object_array_get_idx(lps, t));
        if (L[i] > top) top = L[i], pick = i;
    }
    if (json_object_get_double(json_object_object_get(samp, "temperature")) > 0) {
        unsigned long long z = (unsigned long long)json_object_get_int64(json_object_object_get(samp, "seed")) +
            0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        double u = (double)((z ^ (z >> 31)) >> 11) * 0x1.0p-53;
        for (int i = 0; i < n; i++) sum += exp(L[i] - top);
        double acc = 0;
        for (pick = 0; pick < n - 1; pick++)
            if ((acc += exp(L[pick] - top) / sum) > u) break;
    }
    return oa_force(q, q->rollout, pick);
}

/* Submits the next job of q (rollout, then the scoring) or moves to done. Replies only errors. */
static enum MHD_Result next_job(api_server *s, struct MHD_Connection *c, api_req *x, oa_req *q, int *submitted) {
    *submitted = 0;
    x->job_id[0] = 0;
    x->deadline = clock_mono_s() + 600;
    char id[32] = "";
    enum MHD_Result r = MHD_YES;
    if (q->choosing) {
        if (!submit_logprobs(s, c, x, q, choosing_request(q), id, &r)) return r;
    } else if (q->stage == 0 && q->max_tokens > 0) {
        r = api_submit_and_reply(s, c, x, "rollout", q->rollout, id);
    } else if (q->stage <= 1 && scores(q)) {
        q->stage = 1;
        json_object *sreq = scoring_request(q);
        if (!sreq) q->stage = 2;
        else if (!submit_logprobs(s, c, x, q, sreq, id, &r)) return r;
    } else {
        q->stage = 2;
    }
    if (id[0]) {
        memcpy(x->job_id, id, sizeof id);
        *submitted = 1;
    }
    return r;
}

/* The rollout was just submitted and is streamed token by token: stream: true, unless it scores a
 * given text (echo + logprobs). */
static int streams(const oa_req *q, int submitted) {
    return submitted && q->stage == 0 && !q->choosing && q->stream && !(q->echo && q->logprobs >= 0);
}

static enum MHD_Result completions(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req, int chat) {
    oa_req *q = x->ext;
    enum MHD_Result r;
    int submitted;
    if (!q) {
        api_model m;
        api_error e;
        eng *en = api_engine_or_reply(s, c, x, &m, &r);
        if (!en) return r;
        if (!(q = calloc(1, sizeof *q))) return api_reply_fail(c, x, GE_NOMEM, "", "out of memory");
        x->ext = q;
        x->ext_free = oa_req_free;
        api_limits l = api_limits_now(s);
        if (oa_parse_or_reply(en, req, chat, &l, &m, q, &e)) return api_reply_error(c, x, &e);
        q->policy_version = api_policy_version_now(s);
        r = next_job(s, c, x, q, &submitted);
        if (!submitted && q->stage != 2) return r; /* the error was replied */
        if (streams(q, submitted)) return oa_stream_reply(s, c, x, q, x->job_id);
    }
    while (q->stage < 2) {
        json_object *res = NULL;
        long long pv = -1;
        int st = job_result(s, c, x, &res, &pv, &r);
        if (st != 0) return r; /* suspended (1) or an error replied (-1) */
        if (q->choosing) {
            int rc = choose(q, res);
            json_object_put(res);
            if (rc) return api_reply_fail(c, x, GE_NOMEM, "", "out of memory");
        } else {
            if (q->stage == 0) {
                q->sampled = res;
                q->policy_version = pv;
            } else q->scored = res;
            if (q->stage == 1 && !q->sampled) q->policy_version = pv;
            q->stage++;
        }
        r = next_job(s, c, x, q, &submitted);
        if (!submitted && q->stage != 2) return r;
        if (streams(q, submitted)) return oa_stream_reply(s, c, x, q, x->job_id);
    }
    return reply_choices(s, c, x, q);
}

enum MHD_Result api_oa_completions_post(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req, const char *id) {
    return completions(s, c, x, req, 0);
}
enum MHD_Result api_oa_chat_post(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req, const char *id) {
    return completions(s, c, x, req, 1);
}
