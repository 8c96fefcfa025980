/* fields.h — the generic field getters shared by api/'s request validators (fields.c); not a
 * public header: callers outside api/ use validate.h.
 *
 * Getters read one member key of object o whose path is path ("" at the top level; "groups[0]"
 * inside an array): absent (or null) → *out is the default and 0; present with the wrong type or
 * out of [lo, hi] → a negative GE_* with *e naming the field ("groups[0].n"). */
#ifndef GRPOD_API_FIELDS_H
#define GRPOD_API_FIELDS_H
#include "api/validate.h"

/* out = "base.key", or "key" when base is empty. */
void api_path_join(char *out, size_t n, const char *base, const char *key);
/* Every key of obj must be in allowed (NULL-terminated). */
int api_check_keys(json_object *obj, const char *path, const char *const *allowed, api_error *e);
int api_is_num(json_object *v); /* an int or a double */

int api_get_num(json_object *o, const char *path, const char *key, double lo, double hi, double dflt, double *out, api_error *e);
int api_get_int(json_object *o, const char *path, const char *key, long long lo, long long hi, long long dflt, long long *out,
                api_error *e);
int api_get_bool(json_object *o, const char *path, const char *key, int dflt, int *out, api_error *e);
/* *out is NULL when absent (and not required); points into o. */
int api_get_str(json_object *o, const char *path, const char *key, int required, const char **out, api_error *e);
/* An object member that must be an object (or absent: *out NULL). */
int api_get_obj(json_object *o, const char *path, const char *key, json_object **out, api_error *e);
/* An array of min_len..max_len elements (or absent and not required: *out NULL); at the
 * members packed.h cuts, *out may be a packed array (api_packed_of). */
int api_get_arr(json_object *o, const char *path, const char *key, int required, int min_len, int max_len, json_object **out,
                api_error *e);
/* Token ids: an array of integers in [0, vocab). Returns a new json array in *canon and the
 * ids (malloc'd) in *ids when ids != NULL. */
int api_get_ids(json_object *o, const char *path, const char *key, int required, int min_len, int max_len, int vocab,
                json_object **canon, int **ids, int *n, api_error *e);

/* Canonical payload members: add key k to o (api_put_copy adds a deep copy of v). */
void api_put_num(json_object *o, const char *k, double v);
void api_put_int(json_object *o, const char *k, long long v);
void api_put_bool(json_object *o, const char *k, int v);
void api_put_str(json_object *o, const char *k, const char *v);
void api_put_copy(json_object *o, const char *k, json_object *v);
#endif
