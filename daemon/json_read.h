/* json_read.h — lenient readers of JSON the daemon made or checked itself: stored payloads and
 * results (validated at submit) and the cluster's messages between a leader and its followers.
 * An absent member (or o NULL) gives the default; there are no errors (api/fields.h is the
 * validating kind, for requests). */
#ifndef GRPOD_DAEMON_JSON_READ_H
#define GRPOD_DAEMON_JSON_READ_H
#include <json-c/json.h>

#include "common/err.h"

static inline json_object *field_get(json_object *o, const char *k) {
    json_object *v = NULL;
    return o && json_object_object_get_ex(o, k, &v) ? v : NULL;
}
static inline double field_num(json_object *o, const char *k, double d) {
    json_object *v = field_get(o, k);
    return v ? json_object_get_double(v) : d;
}
static inline long long field_int(json_object *o, const char *k, long long d) {
    json_object *v = field_get(o, k);
    return v ? json_object_get_int64(v) : d;
}
static inline int field_bool(json_object *o, const char *k, int d) {
    json_object *v = field_get(o, k);
    return v ? json_object_get_boolean(v) : d;
}
/* d also when the member is not a string */
static inline const char *field_str(json_object *o, const char *k, const char *d) {
    json_object *v = field_get(o, k);
    return v && json_object_is_type(v, json_type_string) ? json_object_get_string(v) : d;
}
/* A member the validator always writes into a stored job (api/validate.c, where its default is
 * written once): never absent, so no default here; absent, the job fails naming it. */
static inline int field_need(json_object *o, const char *k, json_object **v) {
    *v = field_get(o, k);
    return *v ? 0 : err_set(GE_FORMAT, "stored job: no \"%s\" (the validator writes it at submit)", k);
}
static inline int field_need_int(json_object *o, const char *k, long long *out) {
    json_object *v;
    int rc = field_need(o, k, &v);
    if (!rc) *out = json_object_get_int64(v);
    return rc;
}
static inline int field_need_num(json_object *o, const char *k, double *out) {
    json_object *v;
    int rc = field_need(o, k, &v);
    if (!rc) *out = json_object_get_double(v);
    return rc;
}
static inline int field_need_str(json_object *o, const char *k, const char **out) {
    json_object *v;
    int rc = field_need(o, k, &v);
    if (!rc) *out = json_object_get_string(v);
    return rc;
}
#endif
