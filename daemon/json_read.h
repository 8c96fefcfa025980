/* json_read.h — lenient readers of JSON the daemon made or checked itself: stored payloads and
 * results (validated at submit) and the cluster's messages between a leader and its followers.
 * An absent member (or o NULL) gives the default; there are no errors (api/fields.h is the
 * validating kind, for requests). A stored job's own members are decoded by the rows that
 * validated them (api_params_to_struct, engine/params.h), not here. */
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
#endif
