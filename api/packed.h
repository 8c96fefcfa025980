/* packed.h — token-id and logprob arrays of a request body, cut out before json-c parses it.
 *
 * json-c builds one object per array element (~72 bytes for a 2-byte token id), so an 8 MiB
 * update body of token ids cost ~25 times its size. api_packed_cut scans the body once (a loop
 * with an explicit stack, no recursion) and, where grpod takes token ids or logprobs —
 * groups[i].prompt_ids, groups[i].responses[k].token_ids, .logprobs, .loss_mask (0/1, held as
 * ids) and a top-level tokens — reads each long array of plain numbers into a packed array (int32 ids, or
 * doubles) and overwrites its bytes in the body with a placeholder string padded with spaces:
 * the same length, so json-c's error offsets do not move. api_packed_attach then finds the
 * placeholders in the parsed tree and hangs each packed array on its string (json-c userdata,
 * freed with the object). The field getters (fields.c) read it through api_packed_of, and
 * json-c serializes it as the array it was, numbers in json-c's own formats, so the canonical
 * payload text is what the unpacked parse gives (tests/unit/test_packed.c, fuzz_request.c).
 *
 * Conservative by design: an array is cut only when the scanner read every byte before it as
 * strict JSON and every element is a literal json-c reads to the same value (ids: 0..2^31-1
 * without sign; logprobs: any number, integers of at most 18 digits); anything else stays for
 * json-c and the validators, whose messages are unchanged. The placeholder carries a random
 * per-process nonce, so no body can forge one.
 *
 * Threading: any thread. The caller owns the set until api_packed_attach (which empties it). */
#ifndef GRPOD_API_PACKED_H
#define GRPOD_API_PACKED_H
#include <stddef.h>
#include <stdint.h>

#include <json-c/json.h>

typedef struct {
    unsigned magic;
    int n; /* elements */
    int32_t *ids; /* (n) token ids, or NULL */
    double *nums; /* (n) logprobs, or NULL */
} api_packed;

typedef struct {
    api_packed **v; /* (n) by placeholder index; NULL once attached */
    int n, cap;
} api_packed_set;

/* Cut the arrays out of body (len bytes; rewritten in place). Out of memory stops the cutting:
 * what was not cut is left for json-c. */
void api_packed_cut(char *body, size_t len, api_packed_set *set);
/* Hang set's arrays on their placeholders in root (the parse of the cut body), free the rest
 * and empty set. */
void api_packed_attach(json_object *root, api_packed_set *set);
/* v's packed array when v is an attached placeholder, else NULL. */
const api_packed *api_packed_of(json_object *v);

/* Stored JSON — a job's canonical payload or a rollout's result, valid when it was written —
 * parsed (json_tokener_parse) with the same arrays packed: the engine thread holds ~1.3 bytes
 * per id text byte while a job runs instead of ~25. NULL when not JSON or out of memory. */
json_object *api_packed_parse(const char *text);
/* Readers of an array member that may be packed: its length (0 when v is no array), element i
 * as json_object_get_int (token ids) or json_object_get_double (logprobs) reads it. */
int api_packed_len(json_object *v);
int api_packed_int(json_object *v, int i);
double api_packed_num(json_object *v, int i);
#endif
