/* test_metrics.c — the Prometheus text of /metrics (api/metrics.c), byte for byte.
 *
 * Random counters and gauges (every setter, a few HTTP series, jobs by kind and status, up to
 * five ranks, the store size known or not, ready or failed) are rendered and the texts folded
 * into one FNV-1a digest. The digest was taken from the renderer that wrote each series by hand
 * (main at b16dba9), so a name, a HELP or TYPE line, an order or a number's format that changes
 * fails here; DUMP=1 prints the texts, to diff two builds. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/metrics.h"
#include "tests/unit/check.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(uint32_t n) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng >> 33) % n;
}
static long long big(void) {
    long long a = rnd(1u << 30);
    return a * (long long)(1 + rnd(5000));
}

static void fold(uint64_t *h, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) *h = (*h ^ (unsigned char)s[i]) * 0x100000001b3ull;
}

static void randomize(void) {
    static const char *const methods[] = {"GET", "POST", "DELETE"};
    static const char *const routes[] = {"/v1/jobs/{id}", "/v1/updates", "/metrics", "/v1/chat/completions"};
    for (int i = 0, n = (int)rnd(6); i < n; i++) { /* one draw a statement: the order of arguments is the compiler's */
        const char *method = methods[rnd(3)], *route = routes[rnd(4)];
        metrics_http(method, route, 200 + 100 * (int)rnd(4));
    }
    for (int p = 0; p < MT_N_TOKEN_PHASES; p++)
        if (rnd(3)) metrics_tokens((metrics_token_phase)p, big());
    for (int p = 0; p < MS_N_PHASES; p++)
        if (rnd(3)) metrics_seconds((metrics_seconds_phase)p, (double)rnd(1u << 20) / 977.0);
    metrics_groups_filtered(rnd(100));
    metrics_policy_version(rnd(100000));
    metrics_store_bytes(rnd(4) ? big() : -1);
    long long done = rnd(50);
    metrics_replay(done, 50 + rnd(50));
    metrics_sched_gauges g[6];
    for (int r = 0; r < 6; r++) {
        long long *v = (long long *)&g[r];
        for (size_t k = 0; k < sizeof g[r] / sizeof *v; k++) v[k] = rnd(3) ? big() : 0;
    }
    metrics_sched(&g[5]);
    metrics_ranks(g, (int)rnd(6));
}

TEST(test_metrics_text_unchanged) {
    static const char *const kinds[] = {"rollout", "update", "logprobs", "checkpoint"};
    static const char *const statuses[] = {"queued", "running", "succeeded", "failed", "cancelled"};
    uint64_t h = 0xcbf29ce484222325ull;
    size_t total = 0;
    for (int it = 0; it < 60; it++) {
        randomize();
        metrics_job_count jobs[8];
        int nj = (int)rnd(9);
        for (int i = 0; i < nj; i++) {
            const char *kind = kinds[rnd(4)], *status = statuses[rnd(5)];
            jobs[i] = (metrics_job_count){kind, status, big()};
        }
        char *out = NULL;
        size_t len = 0;
        int ready = (int)rnd(2), failed = rnd(4) == 0;
        long long depth = rnd(1000);
        CHECK_EQ_INT(metrics_render(jobs, nj, depth, ready, failed, &out, &len), 0);
        CHECK(out && strlen(out) == len);
        if (getenv("DUMP")) printf("---- %d\n%s", it, out);
        fold(&h, out, len);
        total += len;
        free(out);
    }
    printf("  %zu bytes, digest 0x%016llxull\n", total, (unsigned long long)h);
    CHECK_MSG(h == 0x0b53efefa98553aaull, "the /metrics text changed");
}

int main(void) {
    RUN(test_metrics_text_unchanged);
    return CHECK_DONE();
}
