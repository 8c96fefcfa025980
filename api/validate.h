/* validate.h — request parsing and validation at the edge (STYLE.md rule 4).
 *
 * Each *_or_reply function reads one request body (a json-c tree), checks every field, and
 * either returns 0 with a canonical payload (defaults filled in, prompts tokenized: what the
 * store keeps and the engine thread runs) or returns a negative GE_* code with *e filled: the
 * error reply itself (status, code, message naming the field, field path such as
 * "groups[0].n"). The HTTP layer sends e verbatim. Nothing here touches the network, the
 * store or the engine directly: the model is reached through api_model's hooks, so the
 * libFuzzer target (tests/fuzz/fuzz_request.c) drives these functions with a fake model.
 *
 * Threading: pure functions of their arguments; any thread. The caller owns (json_object_put)
 * every tree passed in and every payload returned. */
#ifndef GRPOD_API_VALIDATE_H
#define GRPOD_API_VALIDATE_H
#include <stddef.h>

#include <json-c/json.h>

typedef struct {
    int status; /* HTTP status */
    int code; /* GE_* */
    char field[128]; /* "groups[0].n", or "" */
    char message[512];
} api_error;

/* Fill e and return code: api_fail(e, GE_INVALID, "groups[0].n", "groups[0].n must be 1..%d", m). */
int api_fail(api_error *e, int code, const char *field, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

typedef struct {
    long long max_body_bytes; /* 8 MiB */
    int max_n; /* responses per group, 64 */
    int max_tokens; /* sampling.max_tokens cap, 4096 */
    int max_queued_jobs; /* 0 = unlimited */
    int max_groups; /* groups per request, 1024 */
} api_limits;
void api_limits_default(api_limits *l);

/* What validation needs of the model. tokenize/render_chat follow eng_tokenize /
 * eng_render_chat (0 or GE_*; malloc'd outputs). */
typedef struct {
    int vocab, max_pos;
    long long kv_rows; /* rollout KV pool rows; 0 = no check */
    long long state_rows; /* its recurrent-state rows (a group takes n + 1); 0 = no check */
    /* max_tokens_per_micro_batch: the default (0: MB_TOKENS_DEFAULT) and the most an update's
     * activations hold on the device (0: no check), from the engine's memory plan */
    long long mb_tokens, mb_tokens_max;
    int moe_layers; /* MoE layers (0: a dense model; routing replay is refused) */
    int (*tokenize)(void *ud, const char *text, size_t len, int add_special, int **ids, int *n);
    int (*render_chat)(void *ud, const char *const *roles, const char *const *contents, int n, int add_generation_prompt,
                       char **text);
    void *ud;
} api_model;

/* Parse a body strictly (depth <= 64, no trailing bytes). GE_BAD_JSON names line/offset.
 * body is scratch: its token-id and logprob arrays are cut out in place and packed (packed.h),
 * which costs ~1.3-4 bytes per body byte instead of json-c's ~25-36. What json-c would build of
 * the rest is estimated from the text first (over, within 1.3x) and a body above max_tree bytes
 * is refused with 413 above 32 x l->max_body_bytes (l NULL: no limit). The result validates and
 * serializes exactly as api_parse_json_unpacked_or_reply's (json-c alone) does, which the tests
 * and the fuzzer compare it with. */
int api_parse_json_or_reply(char *body, size_t len, const api_limits *l, json_object **out, api_error *e);
int api_parse_json_unpacked_or_reply(const char *body, size_t len, json_object **out, api_error *e);

int api_rollout_or_reply(json_object *req, const api_limits *l, const api_model *m, json_object **payload, api_error *e);
/* Update: *rollout_job_id points into payload when the request names one (caller checks the
 * job exists and is a finished rollout); *expected is -1 when no expected_policy_version. */
int api_update_or_reply(json_object *req, const api_limits *l, const api_model *m, json_object **payload,
                        const char **rollout_job_id, long long *expected, api_error *e);
int api_logprobs_or_reply(json_object *req, const api_limits *l, const api_model *m, json_object **payload, api_error *e);
int api_checkpoint_or_reply(json_object *req, json_object **payload, api_error *e);
/* Tokenize: {"prompt"} or {"messages"} → *ids (malloc'd). Detokenize: {"tokens"} → ids. */
int api_tokenize_or_reply(json_object *req, const api_model *m, int **ids, int *n, api_error *e);
int api_detokenize_or_reply(json_object *req, const api_model *m, int **ids, int *n, int *skip_special, api_error *e);

/* Text for JSON replies: invalid UTF-8 (a byte-level tokenizer can cut a character) and NUL
 * become U+FFFD. Returns a malloc'd NUL-terminated copy, or NULL when out of memory. */
char *api_utf8_sanitize(const char *s, size_t len, size_t *out_len);

/* Checks a job id's shape ("j_" + 16 hex digits). */
int api_job_id_ok(const char *id);
#endif
