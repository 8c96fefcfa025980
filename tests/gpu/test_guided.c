/* test_guided.c (GPU) — constrained decoding through the scheduler on the cuda backend: the
 * embedded default model (random weights: garbage unguided) rolled out under sampling.guided
 * json_object with suffix "}", 16 responses, each must be a JSON object, the suffix and an EOS
 * within max_tokens (the allow masks reach the CUDA sampler through decode.c's staging, in
 * captured graphs too). An unguided job beside it is reported (equal to alone only in exact
 * mode on CUDA: the batch changes bf16 logits otherwise). Prints ROW lines for tests/gpu/run.sh. */
#include "tests/gpu/gpu_check.h"
#include "tests/unit/default_engine.h"
#include "tests/unit/guided_run.h"

int main(void) {
    eng *e = default_engine_on("build/gpu/guided_model", "cuda");
    if (!e) gc_die(NULL, "the default model on cuda");
    guided_result r;
    int rc = guided_run(e, &r);
    if (rc) printf("guided_run: %s\n", err_msg());
    gc_row("guided json_object responses not complete", "default model, 2 groups x 8, max_tokens 40",
           rc ? NAN : (double)(r.responses - r.complete), 0);
    gc_row("guided responses run", "default model, 2 groups x 8", rc ? NAN : fabs((double)r.responses - GR_GROUPS * GR_N), 0);
    printf("unguided job beside the guided one: %d of %d responses as alone (bf16: not asserted)\n", r.beside_same, r.beside);
    eng_close(e);
    return gc_failures ? 1 : 0;
}
