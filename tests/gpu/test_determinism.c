/* test_determinism.c — crash replay's contract on the GPU. Replay after a crash re-applies stored updates in a
 * new process (docs/api.md "Crashes and replay"), so a CUDA update must give the same bits from
 * the same state, in the same process and in another one. This program isolates what differs.
 *
 *   test_determinism run FILE [perturb] [mid] [cpu]
 *     opens the engine on cuda (cpu: the harness checked on the reference backend) — the embedded default model (what the torture test trains), or
 *     with `mid` a 2-layer model with D = 128 heads and C = 512 (the wgmma attention, larger
 *     GEMMs) — and writes FILE: probe logprobs at three packed sizes (T = 12: the few-row GEMM;
 *     T = 45: the cuBLASLt shapes a timing tuner used to choose for; T = 193: larger ones); a
 *     seeded rollout of two groups (tokens, logprobs); then, after a warm-up update, one update U
 *     (four groups, two epochs of two mini-batches, kl and entropy terms): every parameter's
 *     gradient (the last mini-batch's), fp32 master weight and AdamW moments; the probe after U.
 *     Checked in the same process (ROW, tolerance 0 elements, the first differing tensors named):
 *     the probe twice; eng_update_undo gives back master / m / v bit for bit; U again from there
 *     gives the same gradients, weights and moments. Printed (INFO, no pass or fail): how the
 *     first group's rollout differs when it decodes alone instead of beside the second group.
 *     perturb: a process with another history, as a restarted daemon has: 1 GiB less free
 *     device memory (hog), other shapes decoded (roll18: 18 rows) and scored (score) first — GEMM
 *     plans made in another order, other decode graphs captured; each word alone too.
 *   test_determinism compare A B
 *     section by section and tensor by tensor: elements whose bits differ, max |d|; one ROW per
 *     section (tolerance 0) and the differing tensors in order.
 * Prints ROW lines for tests/gpu/run.sh. */
#include <cuda_runtime_api.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/format/config.h"
#include "engine/engine.h"
#include "engine/model/model.h"
#include "engine/train/train_testing.h"
#include "tests/gpu/gpu_check.h"

#define MODEL "/tmp/grpod_gpu_det_model"
#define MODEL_MID "/tmp/grpod_gpu_det_mid"

/* ---------------------------------------------------------------- records: name, n, floats */

typedef struct {
    char name[120];
    long long n;
    float *v;
} rec;
typedef struct {
    rec *r;
    int n, cap;
} recs;

static void rec_add(recs *s, const char *name, const float *v, long long n) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        s->r = realloc(s->r, (size_t)s->cap * sizeof *s->r);
    }
    rec *r = &s->r[s->n++];
    memset(r->name, 0, sizeof r->name);
    snprintf(r->name, sizeof r->name, "%s", name);
    r->n = n;
    r->v = malloc((size_t)(n ? n : 1) * 4);
    memcpy(r->v, v, (size_t)n * 4);
}

/* A flat parameter buffer as one record per tensor, "section:NAME". */
static void rec_add_params(recs *s, const model *m, const char *section, const float *flat) {
    char name[120];
    for (int i = 0; i < m->n_params; i++) {
        snprintf(name, sizeof name, "%s:%s", section, m->params[i].name);
        rec_add(s, name, flat + m->params[i].off, m->params[i].numel);
    }
}

static void recs_write(const recs *s, const char *path) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        printf("FATAL cannot write %s\n", path);
        exit(1);
    }
    for (int i = 0; i < s->n; i++) {
        fwrite(s->r[i].name, sizeof s->r[i].name, 1, f);
        fwrite(&s->r[i].n, sizeof s->r[i].n, 1, f);
        fwrite(s->r[i].v, 4, (size_t)s->r[i].n, f);
    }
    if (fclose(f)) {
        printf("FATAL write %s\n", path);
        exit(1);
    }
}

static void recs_read(recs *s, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        printf("FATAL cannot read %s\n", path);
        exit(1);
    }
    rec r;
    while (fread(r.name, sizeof r.name, 1, f) == 1 && fread(&r.n, sizeof r.n, 1, f) == 1) {
        float *v = malloc((size_t)(r.n ? r.n : 1) * 4);
        if (fread(v, 4, (size_t)r.n, f) != (size_t)r.n) {
            printf("FATAL %s: short\n", path);
            exit(1);
        }
        rec_add(s, r.name, v, r.n);
        free(v);
    }
    fclose(f);
}

/* Elements of a and b whose bits differ; *maxd the largest |a - b| among them. */
static long long bits_differ(const float *a, const float *b, long long n, double *maxd) {
    long long k = 0;
    for (long long i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], 4)) {
            k++;
            double d = fabs((double)a[i] - b[i]);
            if (d > *maxd || d != d) *maxd = d;
        }
    return k;
}

/* Per parameter tensor of two flat buffers: prints the first few that differ; returns the
 * elements that differ in all. */
static long long params_differ(const model *m, const char *what, const float *a, const float *b) {
    long long all = 0;
    int shown = 0;
    for (int i = 0; i < m->n_params; i++) {
        double md = 0;
        long long k = bits_differ(a + m->params[i].off, b + m->params[i].off, m->params[i].numel, &md);
        if (k && shown++ < 6)
            printf("  %s: %s: %lld of %lld differ, max |d| %.3g\n", what, m->params[i].name, k, m->params[i].numel, md);
        all += k;
    }
    return all;
}

/* ---------------------------------------------------------------- inputs */

static unsigned long long lcg = 19;
static int next_id(void) {
    lcg = lcg * 6364136223846793005ULL + 1442695040888963407ULL;
    return 3 + (int)((lcg >> 33) % 248);
}

typedef struct {
    int n_groups;
    eng_update_group g[4];
    int *prompt[4], *R[4], **resp[4];
    float *adv[4];
} groupset;

/* Groups of random byte ids: sizes[g] = {P, n, R_0 .. R_{n-1}}. */
static void groupset_make(groupset *s, int n_groups, const int sizes[][6]) {
    memset(s, 0, sizeof *s);
    s->n_groups = n_groups;
    for (int g = 0; g < n_groups; g++) {
        int P = sizes[g][0], n = sizes[g][1];
        s->prompt[g] = malloc((size_t)P * sizeof(int));
        for (int t = 0; t < P; t++) s->prompt[g][t] = next_id();
        s->R[g] = malloc((size_t)n * sizeof(int));
        s->resp[g] = malloc((size_t)n * sizeof(int *));
        s->adv[g] = malloc((size_t)n * sizeof(float));
        for (int r = 0; r < n; r++) {
            s->R[g][r] = sizes[g][2 + r];
            s->resp[g][r] = malloc((size_t)s->R[g][r] * sizeof(int));
            for (int t = 0; t < s->R[g][r]; t++) s->resp[g][r][t] = next_id();
            s->adv[g][r] = (float)((next_id() % 21) - 10) / 10.0f;
        }
        s->g[g] = (eng_update_group){
            .prompt = s->prompt[g], .P = P, .n = n, .resp = (const int *const *)s->resp[g], .R = s->R[g], .advantage = s->adv[g]};
    }
}

static groupset probe_small, probe_mid, probe_large;

static void make_inputs(void) {
    static const int small[1][6] = {{4, 2, 5, 3}}; /* T = 12 */
    static const int mid[2][6] = {{6, 3, 9, 7, 8}, {5, 2, 6, 4}}; /* T = 45 */
    static const int large[2][6] = {{20, 4, 30, 25, 28, 19}, {12, 3, 20, 22, 17}}; /* T = 193 */
    groupset_make(&probe_small, 1, small);
    groupset_make(&probe_mid, 2, mid);
    groupset_make(&probe_large, 2, large);
}

/* Logprobs of the three probe sets, concatenated (n written to *n). */
static float *probe(eng *e, long long *n) {
    groupset *sets[3] = {&probe_small, &probe_mid, &probe_large};
    float *out = NULL;
    *n = 0;
    for (int k = 0; k < 3; k++) {
        float **lp;
        if (eng_logprobs(e, sets[k]->g, sets[k]->n_groups, 0, 1.0f, 1 << 20, &lp)) {
            printf("FATAL logprobs: %s\n", err_msg());
            exit(1);
        }
        int s = 0;
        for (int g = 0; g < sets[k]->n_groups; g++)
            for (int r = 0; r < sets[k]->g[g].n; r++, s++) {
                out = realloc(out, (size_t)(*n + sets[k]->g[g].R[r]) * 4);
                memcpy(out + *n, lp[s], (size_t)sets[k]->g[g].R[r] * 4);
                *n += sets[k]->g[g].R[r];
            }
        eng_logprobs_free(lp, sets[k]->g, sets[k]->n_groups);
    }
    return out;
}

/* ---------------------------------------------------------------- the mid model */

static int copy_file(const char *from, const char *to) {
    FILE *a = fopen(from, "rb"), *b = a ? fopen(to, "wb") : NULL;
    if (!a || !b) {
        if (a) fclose(a);
        return -1;
    }
    char buf[65536];
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, a)) > 0) fwrite(buf, 1, k, b);
    fclose(a);
    return fclose(b);
}

static void make_mid_model(void) {
    char p[512], q[512];
    snprintf(p, sizeof p, "%s/config.json", MODEL_MID);
    if (access(p, R_OK) == 0) return;
    model_config c;
    if (eng_ensure_default_model(MODEL) || config_load(MODEL, &c)) {
        printf("FATAL default model: %s\n", err_msg());
        exit(1);
    }
    c.L = 2;
    c.C = 512;
    c.H = 4;
    c.K = 2;
    c.D = 128;
    c.F = 1536;
    mkdir(MODEL_MID, 0755);
    const char *files[] = {"tokenizer.json", "tokenizer_config.json"};
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "%s/%s", MODEL, files[i]);
        snprintf(q, sizeof q, "%s/%s", MODEL_MID, files[i]);
        if (copy_file(p, q)) {
            printf("FATAL copy %s\n", p);
            exit(1);
        }
    }
    eng_backend *cpu;
    model m;
    backend_cpu_create(&cpu, 0);
    if (config_write(MODEL_MID, &c) || model_init(&m, &c, cpu)) {
        printf("FATAL mid model: %s\n", err_msg());
        exit(1);
    }
    float *w = malloc((size_t)m.n_elems * 4);
    check_fill(w, (size_t)m.n_elems, 7, 0.04f);
    for (int i = 0; i < m.n_params; i++)
        if (m.params[i].ndim == 1)
            for (long long j = 0; j < m.params[i].numel; j++) w[m.params[i].off + j] = 1.0f + 0.1f * w[m.params[i].off + j];
    if (model_save_host(&m, MODEL_MID, w, 0)) {
        printf("FATAL mid model save: %s\n", err_msg());
        exit(1);
    }
    free(w);
    model_free(&m);
    cpu->destroy(cpu);
}

/* ---------------------------------------------------------------- run */

static void rollout(eng *e, const eng_rollout_group *g, int n, int max_tokens, uint64_t seed, eng_group_result *out) {
    eng_sampling s;
    eng_sampling_default(&s);
    s.temperature = 1.0f;
    s.max_tokens = max_tokens;
    s.ignore_eos = 1;
    s.seed = seed;
    if (eng_rollout(e, g, n, &s, out, NULL, NULL)) {
        printf("FATAL rollout: %s\n", err_msg());
        exit(1);
    }
}

typedef struct {
    float *master, *m, *v, *grad;
} state;

/* The engine's model (its parameters' names and offsets) and trainable elements. */
static const model *model_of(eng *e, long long *n) {
    eng_testing_info ti;
    eng_testing_get(e, &ti);
    if (n) *n = ti.n_train;
    return ti.m;
}

static void snapshot(eng *e, state *s) {
    long long n;
    model_of(e, &n);
    s->master = malloc((size_t)n * 4 + 4);
    s->m = malloc((size_t)n * 4 + 4);
    s->v = malloc((size_t)n * 4 + 4);
    s->grad = malloc((size_t)n * 4 + 4);
    if (eng_testing_state(e, s->master, s->m, s->v) || eng_testing_grad(e, s->grad)) gc_die(NULL, "download");
}

static long long state_differ(const model *m, const char *what, const state *a, const state *b, int grad) {
    char w[64];
    long long k = 0;
    snprintf(w, sizeof w, "%s master", what);
    k += params_differ(m, w, a->master, b->master);
    snprintf(w, sizeof w, "%s adam m", what);
    k += params_differ(m, w, a->m, b->m);
    snprintf(w, sizeof w, "%s adam v", what);
    k += params_differ(m, w, a->v, b->v);
    if (grad) {
        snprintf(w, sizeof w, "%s grad", what);
        k += params_differ(m, w, a->grad, b->grad);
    }
    return k;
}

static void update(eng *e, const eng_update_group *g, int n, int epochs, int mb) {
    loss_config a;
    loss_config_default(&a);
    a.adv = ADV_GIVEN;
    a.kl_coef = 0.01f;
    a.entropy_coeff = 0.001f;
    a.ppo_epochs = epochs;
    a.ppo_mini_batch_size = mb;
    eng_optim o;
    eng_optim_default(&o);
    o.lr = 3e-3f;
    eng_update_result u;
    if (eng_update(e, g, n, &a, &o, 1 << 20, &u, NULL, NULL)) {
        printf("FATAL update: %s\n", err_msg());
        exit(1);
    }
    printf("  update: loss %.9g, grad_norm %.9g, %d optimizer steps, version %lld\n", u.loss, u.grad_norm, u.optimizer_steps,
           u.policy_version_after);
}

enum { P_HOG = 1, P_ROLL = 2, P_SCORE = 4, P_ALL = 7 };

static int run(const char *path, int perturb, int mid, const char *backend) {
    const char *dir = MODEL;
    if (mid) {
        make_mid_model();
        dir = MODEL_MID;
    } else if (eng_ensure_default_model(MODEL)) {
        printf("FATAL default model: %s\n", err_msg());
        return 1;
    }
    eng *e;
    eng_open_opts oo = {.model_dir = dir, .backend = backend, .optimizer_offload = "off"};
    if (eng_open(&oo, &e)) {
        printf("FATAL eng_open: %s\n", err_msg());
        return 1;
    }
    const char *tag = mid ? "mid" : "tiny";
    make_inputs();
    void *hog = NULL;
    /* another history: less free memory, other shapes first */
    if ((perturb & P_HOG) && (strcmp(backend, "cuda") || cudaMalloc(&hog, (size_t)1 << 30) != cudaSuccess)) {
        cudaGetLastError();
        hog = NULL;
    }
    if (perturb & P_ROLL) {
        static const int pp[3][11] = {
            {3, 9, 14, 200, 31, 77, 5, 6, 7, 8, 9}, {100, 101, 102, 0}, {40, 41, 42, 43, 44, 45, 46, 47, 48}};
        eng_rollout_group g[3] = {{pp[0], 11, 5}, {pp[1], 3, 6}, {pp[2], 9, 7}};
        eng_group_result r[3];
        rollout(e, g, 3, 40, 99, r);
        for (int i = 0; i < 3; i++) eng_group_result_free(&r[i]);
    }
    if (perturb & P_SCORE) {
        long long n;
        float **lp;
        if (eng_logprobs(e, probe_large.g, probe_large.n_groups, 1, 0.7f, 1 << 20, &lp) == 0)
            eng_logprobs_free(lp, probe_large.g, probe_large.n_groups);
        free(probe(e, &n));
    }
    recs out = {0};
    char sh[96];
    /* (1) the probe, twice */
    long long np, np2;
    float *p0 = probe(e, &np), *p0b = probe(e, &np2);
    double md = 0;
    snprintf(sh, sizeof sh, "%s, probe T=12,45,193, %lld logprobs", tag, np);
    gc_row("det probe twice in one process (elems differ)", sh, (double)bits_differ(p0, p0b, np, &md), 0);
    rec_add(&out, "probe0", p0, np);
    /* (2) a rollout of two groups; the first group alone */
    static const int q0[7] = {72, 101, 108, 108, 111, 44, 32}, q1[5] = {87, 104, 97, 116, 63};
    eng_rollout_group rg[2] = {{q0, 7, 4}, {q1, 5, 3}};
    eng_group_result rr[2], ra[1];
    rollout(e, rg, 2, 24, 1234, rr);
    rollout(e, rg, 1, 24, 1234, ra);
    int same_tok = 0, bad = 0;
    double lpd = 0;
    for (int g = 0; g < 2; g++)
        for (int r = 0; r < rr[g].n; r++)
            for (int t = 0; t < rr[g].resp[r].n_tokens; t++)
                bad += !isfinite(rr[g].resp[r].logprobs[t]) || rr[g].resp[r].logprobs[t] < -1e3f;
    printf("INFO|%s rollout|first tokens %d %d %d|logprobs not finite or < -1e3: %d of %d\n", tag, rr[0].resp[0].tokens[0],
           rr[0].resp[0].tokens[1], rr[1].resp[0].tokens[0], bad, 7 * 24);
    for (int r = 0; r < 4; r++) {
        eng_response *x = &rr[0].resp[r], *y = &ra[0].resp[r];
        int k = 0;
        while (k < x->n_tokens && k < y->n_tokens && x->tokens[k] == y->tokens[k]) k++;
        same_tok += k == x->n_tokens && k == y->n_tokens;
        for (int t = 0; t < k; t++) {
            double d = fabs((double)x->logprobs[t] - y->logprobs[t]);
            if (d > lpd) lpd = d;
        }
    }
    printf("INFO|%s rollout group 0 alone vs beside group 1|responses with equal tokens %d of 4|logprobs max |d| %.3g "
           "(over the equal prefix)\n",
           tag, same_tok, lpd);
    for (int g = 0; g < 2; g++)
        for (int r = 0; r < rr[g].n; r++) {
            char name[64];
            float *tk = malloc((size_t)(rr[g].resp[r].n_tokens + 1) * 4);
            for (int t = 0; t < rr[g].resp[r].n_tokens; t++) tk[t] = (float)rr[g].resp[r].tokens[t];
            snprintf(name, sizeof name, "rollout_tokens:%d.%d", g, r);
            rec_add(&out, name, tk, rr[g].resp[r].n_tokens);
            snprintf(name, sizeof name, "rollout_logprobs:%d.%d", g, r);
            rec_add(&out, name, rr[g].resp[r].logprobs, rr[g].resp[r].n_tokens);
            free(tk);
        }
    /* (3) the update groups: the rollout's (advantages from the tokens) and probe_mid's */
    eng_update_group ug[4];
    float adv[2][4];
    const int *resp[2][4];
    int R[2][4];
    for (int g = 0; g < 2; g++) {
        for (int r = 0; r < rr[g].n; r++) {
            int even = 0;
            for (int t = 0; t < rr[g].resp[r].n_tokens; t++) even += rr[g].resp[r].tokens[t] % 2 == 0;
            adv[g][r] = (float)even / rr[g].resp[r].n_tokens - 0.5f;
            resp[g][r] = rr[g].resp[r].tokens;
            R[g][r] = rr[g].resp[r].n_tokens;
        }
        ug[g] = (eng_update_group){
            .prompt = rg[g].prompt, .P = rg[g].P, .n = rr[g].n, .resp = resp[g], .R = R[g], .advantage = adv[g]};
    }
    ug[2] = probe_mid.g[0];
    ug[3] = probe_mid.g[1];
    update(e, probe_small.g, 1, 1, 0); /* warm-up: moments not zero */
    state s0, s1, s0b, s1b;
    snapshot(e, &s0);
    update(e, ug, 4, 2, 2);
    snapshot(e, &s1);
    if (eng_update_undo(e)) {
        printf("FATAL undo: %s\n", err_msg());
        return 1;
    }
    snapshot(e, &s0b);
    long long n_train;
    const model *em = model_of(e, &n_train);
    snprintf(sh, sizeof sh, "%s, master + m + v, %lld params", tag, n_train);
    gc_row("det undo restores the state (elems differ)", sh, (double)state_differ(em, "undo", &s0, &s0b, 0), 0);
    update(e, ug, 4, 2, 2);
    snapshot(e, &s1b);
    snprintf(sh, sizeof sh, "%s, 4 groups, 2 epochs x 2 mini-batches", tag);
    gc_row("det same update twice in one process (elems differ)", sh, (double)state_differ(em, "again", &s1, &s1b, 1), 0);
    rec_add_params(&out, em, "grad", s1b.grad);
    rec_add_params(&out, em, "master", s1b.master);
    rec_add_params(&out, em, "adam_m", s1b.m);
    rec_add_params(&out, em, "adam_v", s1b.v);
    long long np1;
    float *p1 = probe(e, &np1);
    rec_add(&out, "probe1", p1, np1);
    recs_write(&out, path);
    for (int g = 0; g < 2; g++) eng_group_result_free(&rr[g]);
    eng_group_result_free(&ra[0]);
    if (hog) cudaFree(hog);
    eng_close(e);
    printf("wrote %s (%d records)\n", path, out.n);
    return gc_failures != 0;
}

/* ---------------------------------------------------------------- compare */

static int compare(const char *pa, const char *pb, const char *tag) {
    recs a = {0}, b = {0};
    recs_read(&a, pa);
    recs_read(&b, pb);
    if (a.n != b.n) {
        printf("FATAL %s has %d records, %s %d\n", pa, a.n, pb, b.n);
        return 1;
    }
    const char *sections[] = {"probe0", "rollout_tokens", "rollout_logprobs", "grad", "master", "adam_m", "adam_v", "probe1"};
    for (int s = 0; s < 8; s++) {
        long long k = 0, n = 0;
        double md = 0;
        int shown = 0, tensors = 0;
        size_t sl = strlen(sections[s]);
        for (int i = 0; i < a.n; i++) {
            if (strncmp(a.r[i].name, sections[s], sl) || (a.r[i].name[sl] && a.r[i].name[sl] != ':')) continue;
            if (strcmp(a.r[i].name, b.r[i].name) || a.r[i].n != b.r[i].n) {
                printf("  %s vs %s: shapes differ (%s %lld, %s %lld)\n", pa, pb, a.r[i].name, a.r[i].n, b.r[i].name, b.r[i].n);
                k += a.r[i].n > b.r[i].n ? a.r[i].n : b.r[i].n;
                continue;
            }
            double d = 0;
            long long ki = bits_differ(a.r[i].v, b.r[i].v, a.r[i].n, &d);
            n += a.r[i].n;
            tensors++;
            if (ki) {
                if (shown++ < 8) printf("  %s: %lld of %lld differ, max |d| %.3g\n", a.r[i].name, ki, a.r[i].n, d);
                if (d > md) md = d;
            }
            k += ki;
        }
        char test[96], sh[96];
        snprintf(test, sizeof test, "det across processes: %s (elems differ)", sections[s]);
        snprintf(sh, sizeof sh, "%s, %d tensors, %lld elems, max |d| %.3g", tag, tensors, n, md);
        gc_row(test, sh, (double)k, 0);
    }
    return gc_failures != 0;
}

int main(int argc, char **argv) {
    if (argc >= 3 && !strcmp(argv[1], "run")) {
        int perturb = 0, mid = 0;
        const char *backend = "cuda";
        for (int i = 3; i < argc; i++) {
            perturb |= !strcmp(argv[i], "perturb") ? P_ALL
                : !strcmp(argv[i], "hog")          ? P_HOG
                : !strcmp(argv[i], "roll18")       ? P_ROLL
                : !strcmp(argv[i], "score")        ? P_SCORE
                                                   : 0;
            mid |= !strcmp(argv[i], "mid");
            if (!strcmp(argv[i], "cpu")) backend = "cpu"; /* the harness itself, on a machine without a GPU */
        }
        return run(argv[2], perturb, mid, backend);
    }
    if (argc >= 4 && !strcmp(argv[1], "compare")) return compare(argv[2], argv[3], argc > 4 ? argv[4] : "");
    fprintf(stderr, "usage: test_determinism run FILE [perturb|hog|roll18|score] [mid] [cpu] | compare A B [TAG]\n");
    return 2;
}
