/* params.h — a request section (sampling, algorithm, optimizer) through its rows in
 * engine/params.c: validation into the canonical JSON stored with the job, the OpenAPI schema,
 * and the stored JSON back into the engine struct. A route that takes one of these sections
 * (POST /v1/rollouts' "sampling", an OpenAI-style route's top-level temperature/top_p/…) calls
 * api_params_or_reply on the object that holds the members, then api_params_to_struct. */
#ifndef GRPOD_API_PARAMS_H
#define GRPOD_API_PARAMS_H
#include "api/validate.h"
#include "engine/params.h"

/* Checks the members of in (NULL: all absent) named by t's rows and returns a new canonical
 * object with every stored row present (defaults filled, the seed drawn, top_k -1 → 0, stop as
 * an array) in *out; or a 4xx in *e naming the field ("sampling.top_p"). path is the section's
 * path in messages ("sampling"; "" when the members sit at the top level). Unknown members are
 * an error unless also_allowed (NULL-terminated, may be NULL) names them. l and m give the
 * PB_MAX_TOKENS and PB_VOCAB bounds (NULL: the row's hi). */
int api_params_or_reply(const eng_params *t, json_object *in, const char *path, const char *const *also_allowed,
                        const api_limits *l, const api_model *m, json_object **out, api_error *e);

/* The unknown-member check of api_params_or_reply alone, for a caller that reports unknown members
 * before it reads the others: every member of in must be a row of t or named by also_allowed. So
 * a caller's list of its own members never repeats the rows' names. */
int api_params_check_keys(const eng_params *t, json_object *in, const char *path, const char *const *also_allowed, api_error *e);

/* A canonical section (from api_params_or_reply, as stored) → dst, the engine struct of t.
 * Absent members keep the rows' defaults. PT_STRS/PT_IDS arrays are malloc'd (free with
 * api_params_free); their strings point into in, which must outlive dst.
 * 0, or GE_NOMEM / GE_INVALID (a stored enum name no row knows). */
int api_params_to_struct(const eng_params *t, json_object *in, void *dst);
void api_params_free(const eng_params *t, void *dst);

/* Moves every member of canon (a canonical section) into dst, in order, and frees canon. */
void api_params_move(json_object *dst, json_object *canon);

/* The OpenAPI 3.0 schema of the section: type, default, range, enum and doc of every row. */
json_object *api_params_schema(const eng_params *t);
#endif
