/* reference_seq.h — one sequence of a transformers reference (a reference.json "sequences" item,
 * tests/fixtures) packed as transformers ran it: alone, from position 0, its first token the
 * prompt and the rest one response, so the batch predicts every token after the first. For the
 * tests that compare the CPU backend with those fixtures. */
#ifndef GRPOD_REFERENCE_SEQ_H
#define GRPOD_REFERENCE_SEQ_H
#include <stdlib.h>

#include "engine/format/json.h"
#include "engine/model/pack.h"

/* b built from seq (pack_batch_free it); 0 or pack_build's error */
static inline int reference_seq_pack(const js *seq, pack_batch *b) {
    int n = seq->n, R = n - 1, *ids = malloc((size_t)n * sizeof(int));
    if (!ids) return -1;
    for (int i = 0; i < n; i++) ids[i] = (int)seq->items[i].num;
    const int *resp[1] = {ids + 1};
    pack_group pg = {.prompt = ids, .P = 1, .N = 1, .resp = resp, .R = &R};
    int rc = pack_build(b, &pg, 0, 1, PACK_PACKED);
    free(ids);
    return rc;
}
#endif
