/* fuzz_config.c — libFuzzer target over config.json checking (engine/format/config.c): the bytes are the
 * file. It parses and passes config_from_json with every value in its documented range
 * (config.h's CFG_MAX_*), or fails with a message; float-to-int conversions out of range
 * (undefined) are what UBSan watches for. config_load is this plus reading the files. */
#include <assert.h>
#include <math.h>
#include <stdint.h>

#include "engine/format/config.h"
#include "common/err.h"
#include "engine/format/json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    js_doc *doc;
    const js *root;
    if (js_parse((const char *)data, size, &doc, &root)) {
        assert(err_msg()[0]);
        return 0;
    }
    model_config c;
    int rc = config_from_json(root, "config.json", &c);
    js_doc_free(doc);
    if (rc) {
        assert(err_msg()[0]);
        return 0;
    }
    assert(c.L >= 1 && c.L <= CFG_MAX_LAYERS && c.C >= 1 && c.C <= CFG_MAX_DIM && c.H >= 1 && c.K >= 1 && c.H % c.K == 0 &&
           c.D >= 2 && c.D % 2 == 0 && c.V >= 1 && c.V <= CFG_MAX_VOCAB && c.max_pos >= 1);
    assert(isfinite(c.eps) && c.eps > 0 && isfinite(c.rope_theta) && c.rope_theta > 0);
    assert(config_n_params(&c) > 0);
    return 0;
}
