/* dashboard.c — the training dashboard: GET /dashboard serves api/dashboard.html, embedded in
 * the binary at compile time (.incbin; the Makefile names the dependency), and GET /v1/dashboard
 * the data it draws: the history rows the engine thread stores per finished rollout/update
 * (daemon/history.c; ?after=ID returns only newer ones), the queue by kind and status, the
 * running jobs, the model, and memory (parameter + optimizer bytes, the rollout KV pool, RSS).
 * Not here: recording the history (daemon/history.c). */
#include "api/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api/metrics.h"
#include "common/err.h"

__asm__(".pushsection .rodata\n"
        ".global api_dashboard_html\n"
        "api_dashboard_html:\n"
        ".incbin \"api/dashboard.html\"\n"
        ".byte 0\n"
        ".popsection\n");
extern const char api_dashboard_html[];

enum MHD_Result api_dashboard_page_get(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req, const char *id) {
    return api_reply_raw(c, x, 200, "text/html; charset=utf-8", (char *)api_dashboard_html, strlen(api_dashboard_html), 0);
}

/* ---------------------------------------------------------------- data */

static void history_cb(void *ud, long long id, double at, const char *kind, long long pv, const char *stats) {
    api_sbuf *b = ud;
    if (b->len && b->p[b->len - 1] == '}') api_sb_str(b, ",");
    api_sb_printf(b, "{\"id\":%lld,\"at\":%.3f,\"kind\":\"%s\",\"policy_version\":%lld,\"stats\":", id, at, kind, pv);
    api_sb_str(b, stats && *stats ? stats : "{}");
    api_sb_str(b, "}");
}

/* counts as {"kind": {"status": n}} */
static void counts_cb(void *ud, const char *kind, const char *status, long long n) {
    json_object *counts = ud, *k;
    if (!json_object_object_get_ex(counts, kind, &k)) {
        k = json_object_new_object();
        json_object_object_add(counts, kind, k);
    }
    json_object_object_add(k, status, json_object_new_int64(n));
}

static long long rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long long pages = 0, rss = 0;
    if (!f) return 0;
    if (fscanf(f, "%lld %lld", &pages, &rss) != 2) rss = 0;
    fclose(f);
    return rss * sysconf(_SC_PAGESIZE);
}

enum MHD_Result api_dashboard_get(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req, const char *id) {
    const char *a = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "after");
    long long after = 0;
    if (a) {
        char *end;
        after = strtoll(a, &end, 10);
        if (*end || end == a || after < 0) return api_reply_fail(c, x, GE_INVALID, "after", "after must be a history id >= 0");
    }
    store *st = api_pool_get(s);
    if (!st) return api_reply_fail(c, x, GE_STORE, "", "cannot open the store");
    api_sbuf h = {0};
    api_sb_str(&h, "");
    json_object *counts = json_object_new_object();
    int rc = store_history_list(st, after, 20000, history_cb, &h);
    if (!rc) rc = store_counts(st, counts_cb, counts);
    long long depth = store_queue_depth(st);
    store_job *run = NULL;
    int n_run = 0;
    if (!rc) rc = store_list(st, NULL, "running", 100, 0, &run, &n_run);
    api_pool_put(s, st);
    if (rc) {
        free(h.p);
        json_object_put(counts);
        return api_reply_fail(c, x, GE_STORE, "", "cannot read the store: %s", err_msg());
    }

    api_sbuf b = {0};
    api_sb_str(&b, "{\"history\":[");
    api_sb_str(&b, h.p ? h.p : "");
    free(h.p);
    api_sb_printf(&b, "],\"queue\":{\"depth\":%lld,\"counts\":", depth < 0 ? 0 : depth);
    api_sb_str(&b, json_object_to_json_string_ext(counts, JSON_C_TO_STRING_PLAIN));
    json_object_put(counts);
    api_sb_str(&b, "},\"running\":[");
    for (int i = 0; i < n_run; i++) {
        api_sb_printf(&b, "%s{\"id\":\"%s\",\"kind\":\"%s\",\"progress\":%.4f,\"started_at\":%.3f}", i ? "," : "", run[i].id,
                      run[i].kind, run[i].progress, run[i].started_at);
    }
    store_jobs_free(run, n_run);
    api_sb_str(&b, "]");
    eng *e = atomic_load(&s->engine);
    metrics_sched_gauges g;
    metrics_sched_get(&g);
    api_sb_printf(&b, ",\"ready\":%s", e && !atomic_load(&s->failed) ? "true" : "false");
    if (e) {
        eng_info in;
        eng_get_info(e, &in);
        api_sb_printf(&b,
                      ",\"model\":{\"arch\":\"%s\",\"backend\":\"%s\",\"dtype\":\"%s\",\"n_layers\":%d,\"d_model\":%d,"
                      "\"vocab\":%d,\"n_params\":%lld,\"policy_version\":%lld,\"model_dir\":",
                      in.arch, in.backend, in.dtype, in.n_layers, in.d_model, in.vocab, in.n_params, in.policy_version);
        json_object *md = json_object_new_string(in.model_dir);
        api_sb_str(&b, json_object_to_json_string(md));
        json_object_put(md);
        /* fp32 weights (the master copy on cuda) + AdamW's two moments */
        api_sb_printf(&b, "},\"memory\":{\"param_bytes\":%lld,", in.n_params * 4 * 3);
    } else {
        api_sb_str(&b, ",\"model\":null,\"memory\":{");
    }
    api_sb_printf(&b,
                  "\"kv_bytes_used\":%lld,\"kv_bytes_capacity\":%lld,\"kv_rows_used\":%lld,\"kv_rows_capacity\":%lld,"
                  "\"rss_bytes\":%lld}}",
                  g.kv_rows_used * g.kv_row_bytes, g.kv_rows_capacity * g.kv_row_bytes, g.kv_rows_used, g.kv_rows_capacity,
                  rss_bytes());
    return api_reply_sb(c, x, 200, &b);
}
