/* openai_stream.c — stream: true on /v1/completions and /v1/chat/completions, token by token:
 * server-sent events written as the continuous-batching scheduler samples the tokens.
 *
 * The rollout job runs as any other; its reply is a libmicrohttpd callback response (chunked, no
 * Content-Length) whose reader takes the job's new tokens from a tap (tap.c) and writes one chunk
 * per choice that has new text, choices interleaved by index as OpenAI's are. When the tap has
 * nothing new the reader suspends the connection until the worker's next step. Text is the
 * decode of the tokens so far, held back where it could still change: a cut UTF-8 character or
 * a trailing U+FFFD (the tokenizer's stand-in for bytes that later tokens may complete), the last (longest stop string - 1) bytes (a stop string in the making is never sent), and under
 * tool_choice auto everything from a "<tool_call>" (or a tail that could begin one); under required
 * or a named function all of it (the answer is the call). When the job
 * ends its stored result is the truth: each choice's rest of the text as the non-streaming reply
 * has it, its tool_calls (one delta), its finish_reason; then usage (stream_options.include_usage)
 * and [DONE]. logprobs ride with the chunk that releases their tokens' text, with top_logprobs
 * k > 0 each token's k alternatives, which the rollout samples beside the token
 * (sampling.top_logprobs, set by openai_request.c for a stream).
 *
 * A client that goes away is noticed at the next write; the response's free callback then
 * cancels the job if it still runs and closes the tap. Not here: echo with logprobs and
 * max_tokens 0 (openai.c answers those at the end: they score a given text). With W > 1 ranks
 * every rank of this process streams (daemon/jobs.c jobs_rollout_peek), and a follower's groups
 * as the follower posts their tokens (daemon/cluster.c part_peek).
 *
 * Threading: the reader and the free callback run on MHD's threads, one at a time per stream. */
#define _GNU_SOURCE /* memmem */
#include "api/internal.h"
#include "api/openai.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/fields.h"
#include "api/metrics.h"
#include "common/err.h"
#include "common/log.h"

#define TOOL_OPEN "<tool_call>"
#define PYTHON_TAG "<|python_tag|>"
enum { OA_STREAM_CALLS = 64 }; /* calls streamed piece by piece per choice (the rest come whole at the end) */

typedef struct {
    int *tok; /* (n) tokens taken from the tap */
    float *lp; /* (n) */
    int *top_ids; /* (n, k): top_logprobs k > 0, sampled beside the tokens (sampling.top_logprobs) */
    float *top_lps;
    int n, cap, k;
    size_t sent; /* bytes of text sent */
    int lp_sent; /* tokens whose logprobs were sent */
    size_t chars; /* completions' text_offset of the next logprob token */
    int oom;
    struct {
        char id[64];
        size_t args_sent; /* bytes of its arguments sent */
    } calls[OA_STREAM_CALLS]; /* the tool calls begun in deltas */
    int n_calls;
} oa_choice;

typedef struct {
    api_server *s;
    oa_req *q;
    api_tap *tap;
    char job_id[32];
    int n_choices;
    oa_choice *ch; /* (n_choices) */
    size_t hold; /* longest stop string - 1 */
    api_sbuf out;
    size_t out_at;
    int started, finished;
} oa_stream;

/* ---------------------------------------------------------------- chunks */

static const char *chunk_object(const oa_req *q) { return q->chat ? "chat.completion.chunk" : "text_completion"; }

/* One choice's chunk: delta (chat, taken) or text (completions), logprobs (taken, may be NULL),
 * finish_reason (NULL: none yet); ids (taken, NULL: none) under key (return_token_ids: a chat's
 * prompt_token_ids on the chunk, the rest on the choice). */
static void chunk_ids(oa_stream *o, int c, json_object *delta, const char *text, size_t len, json_object *lp, const char *fin,
                      const char *key, json_object *ids) {
    const oa_req *q = o->q;
    json_object *env = oa_envelope(q, q->id, chunk_object(q)), *a = json_object_new_array(), *d = json_object_new_object();
    api_put_int(d, "index", c);
    if (ids) json_object_object_add(q->chat && !strcmp(key, "prompt_token_ids") ? env : d, key, ids);
    if (q->chat) json_object_object_add(d, "delta", delta ? delta : json_object_new_object());
    else json_object_object_add(d, "text", json_object_new_string_len(text ? text : "", (int)len));
    json_object_object_add(d, "logprobs", lp);
    json_object_object_add(d, "finish_reason", fin ? json_object_new_string(fin) : NULL);
    json_object_array_add(a, d);
    json_object_object_add(env, "choices", a);
    oa_sse(&o->out, env);
}

static void chunk(oa_stream *o, int c, json_object *delta, const char *text, size_t len, json_object *lp, const char *fin) {
    chunk_ids(o, c, delta, text, len, lp, fin, NULL, NULL);
}

/* logprobs of choice c's tokens [lp_sent, n) of ids/lps (json arrays), or NULL when not asked;
 * tops: their top_ids / top_logprobs (json arrays of arrays, the same positions), or NULL. */
static json_object *logprobs_since(oa_stream *o, int c, json_object *ids, json_object *lps, const oa_tops *tops) {
    oa_choice *h = &o->ch[c];
    int n = (int)json_object_array_length(ids);
    if (o->q->logprobs < 0 || h->lp_sent >= n) return NULL;
    eng *e = atomic_load(&o->s->engine);
    json_object *ni = json_object_new_array(), *nl = json_object_new_array(), *r;
    for (int t = h->lp_sent; t < n; t++) {
        json_object_array_add(ni, json_object_get(json_object_array_get_idx(ids, (size_t)t)));
        json_object_array_add(nl, json_object_get(json_object_array_get_idx(lps, (size_t)t)));
    }
    oa_tops tp = {tops ? tops->ids : NULL, tops ? tops->lps : NULL, h->lp_sent}; /* position t of the chunk is lp_sent + t */
    if (o->q->chat) {
        r = oa_chat_logprobs(e, ni, nl, tp.ids ? &tp : NULL);
    } else {
        r = oa_completion_logprobs(e, ni, nl, 0, h->chars, tp.ids ? &tp : NULL);
        json_object *tk = json_object_object_get(r, "tokens");
        for (size_t t = 0; t < json_object_array_length(tk); t++)
            for (const unsigned char *p = (const unsigned char *)json_object_get_string(json_object_array_get_idx(tk, t)); *p; p++)
                h->chars += (*p & 0xC0) != 0x80;
    }
    json_object_put(ni);
    json_object_put(nl);
    h->lp_sent = n;
    return r;
}

/* A chunk of text [sent, upto) of choice c with the logprobs of its tokens so far. */
static void text_chunk(oa_stream *o, int c, const char *text, size_t upto, json_object *ids, json_object *lps, const oa_tops *tops) {
    oa_choice *h = &o->ch[c];
    while (h->sent < upto && ((unsigned char)text[h->sent] & 0xC0) == 0x80) h->sent++; /* never half a character */
    json_object *lp = logprobs_since(o, c, ids, lps, tops), *delta = NULL;
    if (o->q->chat) {
        delta = json_object_new_object();
        json_object_object_add(delta, "content", json_object_new_string_len(text + h->sent, (int)(upto - h->sent)));
    }
    chunk(o, c, delta, text + h->sent, upto - h->sent, lp, NULL);
    h->sent = upto;
}

/* ---------------------------------------------------------------- while it samples */

static void take_tokens(void *ud, int c, const api_tokens *x) {
    oa_choice *h = &((oa_stream *)ud)->ch[c];
    int n = x->n, k = x->k;
    if (h->n + n > h->cap || k != h->k) {
        int cap = 2 * (h->n + n);
        int *nt = realloc(h->tok, sizeof *nt * (size_t)cap);
        if (nt) h->tok = nt;
        float *nl = nt ? realloc(h->lp, sizeof *nl * (size_t)cap) : NULL;
        if (nl) h->lp = nl;
        int *ti = nl && k ? realloc(h->top_ids, sizeof *ti * (size_t)cap * k) : NULL;
        if (ti) h->top_ids = ti;
        float *tl = ti ? realloc(h->top_lps, sizeof *tl * (size_t)cap * k) : NULL;
        if (tl) h->top_lps = tl;
        if (!nl || (k && !tl) || (h->n && k != h->k)) {
            h->oom = 1; /* the rest comes from the stored result */
            return;
        }
        h->cap = cap;
        h->k = k;
    }
    memcpy(h->tok + h->n, x->tok, sizeof *x->tok * (size_t)n);
    memcpy(h->lp + h->n, x->lp, sizeof *x->lp * (size_t)n);
    if (k) {
        memcpy(h->top_ids + (size_t)h->n * k, x->top_ids, sizeof(int) * (size_t)n * k);
        memcpy(h->top_lps + (size_t)h->n * k, x->top_lps, sizeof(float) * (size_t)n * k);
    }
    h->n += n;
}

/* len without a character cut at its end (its next bytes may complete it). */
static size_t whole_chars(const char *text, size_t len) {
    size_t back = 0;
    while (back < 3 && back < len && ((unsigned char)text[len - 1 - back] & 0xC0) == 0x80) back++;
    if (back == len) return len;
    unsigned char lead = (unsigned char)text[len - 1 - back];
    size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
    return need > back + 1 && lead >= 0xC0 ? len - back - 1 : len;
}

/* How much of the (valid UTF-8) text[0, len) can be sent now (see the opening). */
static size_t safe_len(const oa_stream *o, const char *text, size_t len) {
    size_t k = len;
    if (o->q->forced) return 0; /* the whole answer is the forced call: sent as tool_calls deltas */
    if (o->q->chat && o->q->tool_choice == OA_TOOLS_AUTO && o->q->tool_format == ENG_TOOLS_LLAMA3) {
        size_t m = len < strlen(PYTHON_TAG) ? len : strlen(PYTHON_TAG); /* an answer that opens with a call is all calls */
        if (!len || text[0] == '{' || !memcmp(text, PYTHON_TAG, m)) return 0;
    } else if (o->q->chat && o->q->tool_choice == OA_TOOLS_AUTO) {
        const char *at = memmem(text, k, TOOL_OPEN, strlen(TOOL_OPEN));
        if (at) k = (size_t)(at - text);
        else
            for (size_t m = strlen(TOOL_OPEN) - 1; m > 0; m--)
                if (m <= k && !memcmp(text + k - m, TOOL_OPEN, m)) {
                    k -= m;
                    break;
                }
    }
    /* U+FFFD at the end: the decoder's stand-in for bytes that the next tokens may complete */
    while (k >= 3 && !memcmp(text + k - 3, "\xEF\xBF\xBD", 3)) k -= 3;
    k = k > o->hold ? k - o->hold : 0;
    while (k > 0 && ((unsigned char)text[k] & 0xC0) == 0x80) k--; /* a character boundary */
    return k;
}

/* A delta with one tool call's entry: its index, and id, type and name when it begins (name
 * NULL: an arguments piece); lp (taken, may be NULL) rides with it. */
static void call_chunk(oa_stream *o, int c, int i, const char *id, const char *name, const char *args, size_t len, json_object *lp) {
    json_object *one = json_object_new_object(), *fn = json_object_new_object(), *a = json_object_new_array();
    json_object *delta = json_object_new_object();
    api_put_int(one, "index", i);
    if (name) {
        api_put_str(one, "id", id);
        api_put_str(one, "type", "function");
        api_put_str(fn, "name", name);
    }
    json_object_object_add(fn, "arguments", json_object_new_string_len(args, (int)len));
    json_object_object_add(one, "function", fn);
    json_object_array_add(a, one);
    json_object_object_add(delta, "tool_calls", a);
    chunk(o, c, delta, "", 0, lp, NULL);
}

/* The tool calls of choice c's text so far as OpenAI streams them: a call's first delta when its
 * name is written (id, type, name, arguments ""), then its arguments piece by piece (their
 * json.dumps form so far: oa_calls_progress), calls in order. */
static void stream_calls(oa_stream *o, int c, const char *text) {
    const oa_req *q = o->q;
    oa_choice *h = &o->ch[c];
    api_sbuf full = {0};
    size_t n = strlen(text);
    while (n >= 3 && !memcmp(text + n - 3, "\xEF\xBF\xBD", 3)) n -= 3; /* as safe_len: bytes the next tokens may complete */
    api_sb_str(&full, q->forced ? q->forced : "");
    api_sb_printf(&full, "%.*s", (int)n, text);
    oa_call_progress pr[OA_STREAM_CALLS] = {{0}};
    int k = full.oom ? 0 : oa_calls_progress(q->tool_format, full.p, pr, q->parallel_tool_calls ? OA_STREAM_CALLS : 1);
    free(full.p);
    for (int i = 0; i < k; i++) {
        if (pr[i].name && i == h->n_calls) {
            oa_new_id(h->calls[i].id, sizeof h->calls[i].id, "chatcmpl-tool-");
            call_chunk(o, c, i, h->calls[i].id, pr[i].name, "", 0, NULL);
            h->n_calls++;
        }
        size_t len = pr[i].args ? strlen(pr[i].args) : 0;
        if (i < h->n_calls && len > h->calls[i].args_sent) {
            call_chunk(o, c, i, NULL, NULL, pr[i].args + h->calls[i].args_sent, len - h->calls[i].args_sent, NULL);
            h->calls[i].args_sent = len;
        }
    }
    for (int i = 0; i < k; i++) free(pr[i].name), free(pr[i].args);
}

static void send_new_text(oa_stream *o) {
    eng *e = atomic_load(&o->s->engine);
    for (int c = 0; c < o->n_choices; c++) {
        oa_choice *h = &o->ch[c];
        if (h->oom || h->n == 0) continue;
        char *t = NULL;
        size_t len = 0;
        if (eng_detokenize(e, h->tok, h->n, o->q->skip_special, &t, &len)) {
            err_clear();
            continue;
        }
        size_t sl = 0;
        char *clean = api_utf8_sanitize(t ? t : "", whole_chars(t ? t : "", len), &sl); /* as the result's text */
        free(t);
        t = clean;
        size_t k = t ? safe_len(o, t, sl) : 0;
        if (k > h->sent) {
            json_object *ids = json_object_new_array(), *lps = json_object_new_array();
            oa_tops tops = {h->k ? json_object_new_array() : NULL, h->k ? json_object_new_array() : NULL, 0};
            for (int i = 0; o->q->logprobs >= 0 && i < h->n; i++) {
                json_object_array_add(ids, json_object_new_int(h->tok[i]));
                json_object_array_add(lps, json_object_new_double(h->lp[i]));
                if (!h->k) continue;
                json_object *ti = json_object_new_array(), *tl = json_object_new_array();
                for (int j = 0; j < h->k; j++) {
                    json_object_array_add(ti, json_object_new_int(h->top_ids[(size_t)i * h->k + j]));
                    json_object_array_add(tl, json_object_new_double(h->top_lps[(size_t)i * h->k + j]));
                }
                json_object_array_add(tops.ids, ti);
                json_object_array_add(tops.lps, tl);
            }
            text_chunk(o, c, t, k, ids, lps, h->k ? &tops : NULL);
            json_object_put(ids);
            json_object_put(lps);
            json_object_put(tops.ids);
            json_object_put(tops.lps);
        }
        if (t && o->q->chat && o->q->tool_choice != OA_TOOLS_NONE) stream_calls(o, c, t);
        free(t);
    }
}

/* ---------------------------------------------------------------- when the job ends */

static void send_rest(oa_stream *o, long long *completion) {
    eng *e = atomic_load(&o->s->engine);
    const oa_req *q = o->q;
    for (int c = 0; c < o->n_choices; c++) {
        oa_choice *h = &o->ch[c];
        json_object *resp = oa_response(q, c / q->n, c % q->n);
        json_object *ids = resp ? json_object_object_get(resp, "token_ids") : NULL;
        json_object *lps = resp ? json_object_object_get(resp, "logprobs") : NULL;
        oa_tops tops = {resp ? json_object_object_get(resp, "top_ids") : NULL,
                        resp ? json_object_object_get(resp, "top_logprobs") : NULL, 0};
        const char *fin = resp ? json_object_get_string(json_object_object_get(resp, "finish_reason")) : NULL;
        char *text = resp ? oa_response_text(e, q, resp) : strdup("");
        size_t len = text ? strlen(text) : 0;
        json_object *calls = NULL;
        *completion += ids ? (long long)json_object_array_length(ids) : 0;
        if (q->chat && text) calls = oa_answer_calls(q, text, &len);
        if (text && len > h->sent) text_chunk(o, c, text, len, ids, lps, tops.ids ? &tops : NULL);
        json_object *lp = ids ? logprobs_since(o, c, ids, lps, tops.ids ? &tops : NULL) : NULL;
        for (int i = 0; calls && i < (int)json_object_array_length(calls); i++) {
            /* the rest of each call: the arguments' unsent tail of one begun, a call not begun whole */
            json_object *call = json_object_array_get_idx(calls, (size_t)i), *fn = json_object_object_get(call, "function");
            const char *args = json_object_get_string(json_object_object_get(fn, "arguments"));
            size_t len = strlen(args), from = i < h->n_calls ? h->calls[i].args_sent : 0;
            int last = i + 1 == (int)json_object_array_length(calls);
            int send = i >= h->n_calls || len > from || (last && lp);
            if (i >= h->n_calls)
                call_chunk(o, c, i, json_object_get_string(json_object_object_get(call, "id")),
                           json_object_get_string(json_object_object_get(fn, "name")), args, len, last ? lp : NULL);
            else if (send)
                call_chunk(o, c, i, NULL, NULL, args + (len > from ? from : len), len > from ? len - from : 0, last ? lp : NULL);
            if (last && send) lp = NULL;
        }
        if (calls) {
            fin = "tool_calls";
            json_object_put(calls);
        }
        /* return_token_ids: the choice's ids, all in its last chunk */
        chunk_ids(o, c, NULL, "", 0, lp, fin && *fin ? fin : "length", "token_ids",
                  q->return_ids ? (ids ? json_object_get(ids) : json_object_new_array()) : NULL);
        free(text);
    }
}

static void send_error(oa_stream *o, const char *error_json) {
    api_sb_str(&o->out, "data: {\"error\":");
    api_sb_str(&o->out, error_json ? error_json : "{\"code\":\"conflict\",\"message\":\"cancelled\"}");
    api_sb_str(&o->out, "}\n\n");
}

/* The job's state from the store: its end written out (o->finished), or nothing while it runs. */
static void check_job(oa_stream *o) {
    store *st = api_pool_get(o->s);
    store_job j = {0};
    if (!st || store_get(st, o->job_id, &j)) {
        api_pool_put(o->s, st);
        err_clear();
        return; /* looked at again at the next change */
    }
    api_pool_put(o->s, st);
    if (j.status == JOB_DONE) {
        json_object *res = j.result ? json_tokener_parse(j.result) : NULL;
        if (!res) {
            send_error(o, "{\"code\":\"internal\",\"message\":\"the job's result is unreadable\"}");
        } else {
            long long completion = 0;
            o->q->sampled = res;
            send_rest(o, &completion);
            if (o->q->include_usage) {
                json_object *env = oa_envelope(o->q, o->q->id, chunk_object(o->q));
                json_object_object_add(env, "choices", json_object_new_array());
                json_object_object_add(env, "usage", oa_usage(o->q, completion));
                oa_sse(&o->out, env);
            }
        }
    } else if (j.status == JOB_FAILED || j.status == JOB_CANCELLED) {
        send_error(o, j.error);
    }
    if (j.status != JOB_QUEUED && j.status != JOB_RUNNING) {
        api_sb_str(&o->out, "data: [DONE]\n\n");
        o->finished = 1;
    }
    store_job_clear(&j);
}

/* ---------------------------------------------------------------- the response */

static void first_chunks(oa_stream *o) {
    const oa_req *q = o->q;
    for (int c = 0; c < o->n_choices; c++) {
        json_object *pid = q->return_ids ? json_object_get(oa_prompt_ids(q, c / q->n)) : NULL;
        if (q->chat) {
            json_object *delta = json_object_new_object();
            api_put_str(delta, "role", "assistant");
            api_put_str(delta, "content", "");
            chunk_ids(o, c, delta, "", 0, NULL, NULL, "prompt_token_ids", pid);
        } else if (q->echo || pid) {
            char *p = q->echo ? oa_ids_text(atomic_load(&o->s->engine), oa_prompt_ids(q, c / q->n), 0) : strdup("");
            chunk_ids(o, c, NULL, p ? p : "", p ? strlen(p) : 0, NULL, NULL, "prompt_token_ids", pid);
            free(p);
        }
    }
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    oa_stream *o = cls;
    (void)pos;
    for (;;) {
        if (o->out.oom) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (o->out_at < o->out.len) {
            size_t n = o->out.len - o->out_at < max ? o->out.len - o->out_at : max;
            memcpy(buf, o->out.p + o->out_at, n);
            o->out_at += n;
            return (ssize_t)n;
        }
        o->out.len = o->out_at = 0;
        if (o->finished) return MHD_CONTENT_READER_END_OF_STREAM;
        if (atomic_load(&o->s->stopping)) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (!o->started) {
            o->started = 1;
            first_chunks(o);
            continue;
        }
        int st = api_tap_poll(o->s, o->tap, take_tokens, o);
        if (st == 0) return 0; /* suspended until the next step */
        send_new_text(o);
        if (st & API_TAP_CHANGED) check_job(o);
    }
}

static void stream_free(void *cls) {
    oa_stream *o = cls;
    if (!o->finished && !atomic_load(&o->s->stopping)) { /* the client went away: stop sampling for it */
        store *st = api_pool_get(o->s);
        if (st && store_cancel(st, o->job_id) == 0) log_event(LOG_INFO, "stream_abandoned", "\"id\":\"%s\"", o->job_id);
        err_clear();
        api_pool_put(o->s, st);
    }
    api_tap_close(o->s, o->tap);
    for (int c = 0; c < o->n_choices; c++) {
        free(o->ch[c].tok);
        free(o->ch[c].lp);
        free(o->ch[c].top_ids);
        free(o->ch[c].top_lps);
    }
    free(o->ch);
    free(o->out.p);
    oa_req_free(o->q);
    free(o);
}

enum MHD_Result oa_stream_reply(api_server *s, struct MHD_Connection *c, api_req *x, oa_req *q, const char *job_id) {
    x->ext = NULL; /* q is the stream's now */
    x->ext_free = NULL;
    oa_stream *o = calloc(1, sizeof *o);
    if (o) {
        o->s = s;
        o->q = q;
        snprintf(o->job_id, sizeof o->job_id, "%s", job_id);
        o->n_choices = q->n_prompts * q->n;
        o->ch = calloc((size_t)o->n_choices, sizeof *o->ch);
        if (!o->ch) o->n_choices = 0;
        o->tap = o->ch ? api_tap_open(s, job_id, q->n_prompts, q->n, c) : NULL;
        json_object *stops = json_object_object_get(json_object_object_get(q->rollout, "sampling"), "stop");
        for (size_t k = 0; k < json_object_array_length(stops); k++) {
            size_t l = strlen(json_object_get_string(json_object_array_get_idx(stops, k)));
            if (l > 0 && l - 1 > o->hold) o->hold = l - 1;
        }
    }
    struct MHD_Response *r = o && o->tap ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, o, stream_free)
                                         : NULL;
    if (!r) {
        if (o) {
            o->finished = 1; /* nothing to cancel: the job runs on, as a non-streaming one would */
            stream_free(o);
        } else {
            oa_req_free(q);
        }
        return api_reply_fail(c, x, GE_NOMEM, "", "out of memory");
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream; charset=utf-8");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    enum MHD_Result ok = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    metrics_http(x->method, x->route ? x->route : "other", 200);
    return ok;
}
