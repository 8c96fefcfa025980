/* cluster.c — the leader's routes for its followers (/v1/cluster/join, next, done, beat): each
 * hands its ?follower= and ?after= values and its body to the hook daemon/cluster.c set with
 * api_set_cluster_hook, and replies what the hook returns. Without a hook (this grpod leads no
 * followers) they answer 422. */
#include "api/internal.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"

void api_set_cluster_hook(api_server *s, api_cluster_fn fn, void *ud) {
    atomic_store(&s->cluster_ud, ud);
    atomic_store(&s->cluster_fn, fn);
}

/* A query value that is a whole number >= 0, else -1. */
static long long query_int(struct MHD_Connection *c, const char *k) {
    const char *v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, k);
    char *end;
    long long x = v && *v ? strtoll(v, &end, 10) : -1;
    return v && *v && !*end && x >= 0 ? x : -1;
}

static enum MHD_Result cluster_reply(api_server *s, struct MHD_Connection *c, api_req *x, int route) {
    api_cluster_fn fn = atomic_load(&s->cluster_fn);
    if (!fn) return api_reply_fail(c, x, GE_UNSUPPORTED, "", "this grpod is not a leader (grpod serve --followers K)");
    char *reply = NULL;
    int st = fn(atomic_load(&s->cluster_ud), route, query_int(c, "follower"), query_int(c, "after"), x->body ? x->body : "",
                x->len, &reply);
    if (!reply) return api_reply_raw(c, x, st, "application/json", (char *)"", 0, 0);
    return api_reply_raw(c, x, st, "application/json", reply, strlen(reply), 1);
}

enum MHD_Result api_cluster_join_post(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req, const char *id) {
    return cluster_reply(s, c, x, API_CLUSTER_JOIN);
}
enum MHD_Result api_cluster_next_get(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req, const char *id) {
    return cluster_reply(s, c, x, API_CLUSTER_NEXT);
}
enum MHD_Result api_cluster_done_post(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req, const char *id) {
    return cluster_reply(s, c, x, API_CLUSTER_DONE);
}
enum MHD_Result api_cluster_beat_get(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req, const char *id) {
    return cluster_reply(s, c, x, API_CLUSTER_BEAT);
}
