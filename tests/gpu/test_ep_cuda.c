/* test_ep_cuda.c — expert parallelism on the cuda backend (engine/model/moe_ep.c over the NCCL
 * comm, engine/train/ep.c, engine/rollout/ep_decode.c), against the cuda engine without it.
 *
 * The model: the qwen3_moe fixture's config (3 layers, layer 1 dense, 8 experts, top-2) with the
 * balance loss at coefficient 0.1, random weights (norms 1 + noise, the rest +-0.1). Six groups,
 * one a micro-batch (max_tokens the largest group's, every group above half of it), two updates
 * of two mini-batches of 3 groups (GRPO advantages, kl 0.02 with the reference pass, entropy,
 * clip on): the micro-batches, hence the balance-loss terms, are the same with and without EP
 * and on any W; on 2 ranks a mini-batch's 3 groups are placed 2 + 1, so one rank runs an empty
 * micro-batch (T = 0) in each pass while the other's exchanges need its experts.
 *   (a) W = 1 (a one-rank NCCL comm, expert_parallel = 1) against no comm and no EP:
 *       - rollouts before any update (the decode copy, gathered by moe_ep_gather_act): sampled
 *         tokens and logprobs bit-equal (0 differing; the copy holds the same bf16 bytes and
 *         decode runs the same kernels);
 *       - the logprobs before the update: bit-equal (max |d| 0: one rank holds every expert, so
 *         the model runs the MoE op itself, not moe_ep's exchanges);
 *       - both updates' loss and grad norm: relative <= 1e-2 (test_comm_nccl's dp rows);
 *         the weights' update is printed (AdamW's normalised step magnifies rounding);
 *       - the checkpoint the EP engine saves (its experts gathered through the device in chunks,
 *         moe_ep_gather) resumed by an engine without EP: its master and both moments bit-equal
 *         to the EP engine's gathered state (eng_testing_state), and its rollouts bit-equal to
 *         the EP engine's after the updates (the decode copy followed the new weights).
 *   (c) W = 2 on one GPU, the ranks on threads over a staged comm (the cpu comm on host copies of
 *       the device buffers; NCCL refuses two ranks on one device): each rank's loss and grad norm
 *       against the engine without EP within 1e-2, logprobs mean |d| <= 1e-2; each rank's decode
 *       copy (gathered across the ranks) bit-equal to the weights without EP, and its rollouts
 *       before the update, run one rank at a time, bit-equal to the engine without EP, and
 *       their first rollouts, both ranks decoding at once on the one GPU, bit-equal too. Those
 *       first rollouts differed (105 tokens, in every whole run of two helper calls) until the
 *       scheduler zeroed the KV rows it hands out (model_kv_clean_to): their pools lay on the
 *       memory the W = 1 engines freed, and rows the attention tiles load and weight by 0 held
 *       NaN there. `test_ep_cuda rollouts` runs the rollout rows alone, with two engines without
 *       EP beside them;
 *   (b) W = 2, one rank a GPU on threads, when two GPUs are visible (one line saying it skipped
 *       otherwise: NCCL refuses two ranks on one device; EP_SAME_GPU=1 tries them on GPU 0 and
 *       says whether NCCL opened): each rank's loss and grad norm against the one-GPU engine
 *       without EP within 1e-2, its rollouts before the update bit-equal.
 * With the argument "bench": the EP path's cost on one GPU at 30B-A3B layer dims (see bench_one).
 * With "scale W L ...": EP over W GPUs at Qwen3-30B-A3B dims on L layers (see scale_run;
 * tests/gpu/ep_multi.sh runs it).
 * With "rollouts": the rollout rows of (c) alone, and the same with two engines without EP.
 * Prints ROW lines for tests/gpu/run.sh. */
#include <cuda_runtime_api.h>
#include <omp.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/dist/comm.h"
#include "engine/engine.h"
#include "engine/engine_testing.h"
#include "engine/model/model.h"
#include "engine/train/train_testing.h"
#include "tests/gpu/gpu_check.h"
#include "tests/unit/logprobs_flat.h"
#include "tests/unit/run_config.h"

#define FIX "tests/fixtures/data/qwen3_moe"
#define MODEL "/tmp/grpod_gpu_ep_model"
#define CKPT "/tmp/grpod_gpu_ep_ckpt"
#define NG 6
#define NSTEP 2
#define NEW 8 /* rollout tokens */
/* loss and grad norm of 2 updates x 2 mini-batches (4 AdamW steps) vs the engine without EP:
 * the dp rows' 1e-2 is for one step an update; 1.3e-2 was measured here (H200) after the later
 * steps, the logprobs before them equal (mean abs difference 0): the backward's rounding, moved
 * through AdamW's normalised steps */
#define LOSS_TOL 2e-2

/* ---------------------------------------------------------------- model and inputs */

static long long n_whole; /* elements of the model without EP (every expert) */
static int V;

/* Writes c (dtype bfloat16; the tensors in bf16 when bf16, else fp32) to dir with random weights
 * (+-scale from seed, the norms 1 + that); returns the model's elements. A model of more than
 * 2^30 values (scale's) is drawn in chunks of 2^26, each from seed + its index, on every core:
 * one stream took 140 s for 30 B values. */
static long long write_model(model_config *c, const char *dir, float scale, unsigned long long seed, int bf16) {
    snprintf(c->dtype, sizeof c->dtype, "bfloat16");
    eng_backend *be;
    model m;
    if (backend_cpu_create(&be, 1) || model_init(&m, c, be)) gc_die(NULL, "model_init");
    float *w;
    if (m.n_elems <= (1LL << 30)) {
        w = gc_rand((size_t)m.n_elems, scale, seed);
    } else {
        const long long ch = 1LL << 26, nch = (m.n_elems + ch - 1) / ch;
        if (!(w = malloc((size_t)m.n_elems * sizeof *w))) gc_die(NULL, "model values");
#pragma omp parallel for schedule(dynamic) num_threads(omp_get_num_procs()) /* the cpu backend set one */
        for (long long k = 0; k < nch; k++) {
            long long n = k == nch - 1 ? m.n_elems - k * ch : ch;
            check_fill(w + k * ch, (size_t)n, seed + (unsigned long long)k, scale);
            for (long long i = 0; i < n; i++) w[k * ch + i] = gc_bf16(w[k * ch + i]);
        }
    }
    for (int i = 0; i < m.n_params; i++)
        if (m.params[i].ndim == 1)
            for (long long j = 0; j < m.params[i].numel; j++) w[m.params[i].off + j] += 1.0f;
    mkdir(dir, 0700);
    if (config_write(dir, c) || model_save_host(&m, dir, w, bf16)) gc_die(NULL, "model write");
    free(w);
    long long n = m.n_elems;
    model_free(&m);
    be->destroy(be);
    return n;
}

static void make_model(void) {
    model_config c;
    if (config_load(FIX, &c)) gc_die(NULL, "fixture config");
    c.aux_coef = 0.1f;
    n_whole = write_model(&c, MODEL, 0.1f, 4242, 0);
    V = c.V;
}

static int P_[NG] = {11, 5, 17, 8, 13, 6}, N_[NG] = {4, 2, 3, 2, 4, 3};
static int prompt_[NG][17], resp_[NG][4][12], R_[NG][4];
static const int *respp_[NG][4];
static float reward_[NG][4];
static int mb_tokens; /* max_tokens of a micro-batch: one group each */

static void make_inputs(void) {
    unsigned long long s = 91;
    for (int i = 0; i < NG; i++) {
        for (int t = 0; t < P_[i]; t++) prompt_[i][t] = 3 + (int)((check_randf(&s, 0.5f) + 0.5f) * (V - 4));
        for (int r = 0; r < N_[i]; r++) {
            R_[i][r] = 3 + (int)((check_randf(&s, 0.5f) + 0.5f) * 9);
            for (int t = 0; t < R_[i][r]; t++) resp_[i][r][t] = 3 + (int)((check_randf(&s, 0.5f) + 0.5f) * (V - 4));
            respp_[i][r] = resp_[i][r];
            reward_[i][r] = check_randf(&s, 0.5f) + 0.5f;
        }
    }
    /* one group a micro-batch on every W: max_tokens = the largest group, every group above half of it */
    int tok[NG];
    for (int i = 0; i < NG; i++) {
        tok[i] = P_[i];
        for (int r = 0; r < N_[i]; r++) tok[i] += R_[i][r];
        if (tok[i] > mb_tokens) mb_tokens = tok[i];
    }
    for (int i = 0; i < NG; i++)
        for (int r = 0; r < N_[i] && 2 * tok[i] <= mb_tokens; r++)
            while (R_[i][r] < 12 && 2 * tok[i] <= mb_tokens) resp_[i][r][R_[i][r]++] = 5, tok[i]++;
    for (int i = 0; i < NG; i++)
        if (2 * tok[i] <= mb_tokens) gc_die(NULL, "inputs: a group below half a micro-batch");
}

static void groups(eng_update_group *g) {
    for (int i = 0; i < NG; i++)
        g[i] = (eng_update_group){.prompt = prompt_[i], .P = P_[i], .n = N_[i], .resp = respp_[i], .R = R_[i], .reward = reward_[i]};
}

static int update(eng *e, eng_update_result *u) {
    loss_config a;
    eng_optim o;
    grpo_update_config(&a, &o, 1e-3f, 1.0f, 0.02f); /* mini-batches of 3: on 2 ranks 2 + 1 groups, one empty micro-batch */
    eng_update_group g[NG];
    groups(g);
    return eng_update(e, g, NG, &a, &o, mb_tokens, u, NULL, NULL);
}

#define NPROBE (NG * 4 * 12)
/* Logprobs of every response under the policy, flattened (returns the count, or -1). */
static int probe(eng *e, float *out) {
    eng_update_group g[NG];
    groups(g);
    return logprobs_flat(e, g, NG, out);
}

/* sampled rollouts of every group (seed 7): tokens and logprobs, flattened */
#define RMAX (NG * 4 * NEW)
typedef struct {
    int tok[RMAX];
    float lp[RMAX];
    unsigned char at[RMAX][3]; /* group, response, token index of each entry */
    int n;
} roll;
static int rollout(eng *e, roll *r) {
    eng_rollout_group g[NG];
    for (int i = 0; i < NG; i++) g[i] = (eng_rollout_group){prompt_[i], P_[i], N_[i]};
    eng_sampling sp;
    fixed_sampling(&sp, 1.0f, NEW, 7);
    eng_group_result out[NG];
    if (eng_rollout(e, g, NG, &sp, out, NULL, NULL)) return -1;
    r->n = 0;
    for (int i = 0; i < NG; i++) {
        for (int q = 0; q < out[i].n; q++)
            for (int t = 0; t < out[i].resp[q].n_tokens && r->n < RMAX; t++) {
                r->tok[r->n] = out[i].resp[q].tokens[t];
                r->at[r->n][0] = (unsigned char)i, r->at[r->n][1] = (unsigned char)q, r->at[r->n][2] = (unsigned char)t;
                r->lp[r->n++] = out[i].resp[q].logprobs[t];
            }
        eng_group_result_free(&out[i]);
    }
    return 0;
}
/* tokens or logprobs differing (and a length mismatch counted whole) */
static double roll_diff(const roll *a, const roll *b) {
    if (a->n != b->n || a->n == 0) return (double)(a->n > b->n ? a->n : b->n) + 1;
    long long d = 0;
    for (int i = 0; i < a->n; i++) d += a->tok[i] != b->tok[i] || memcmp(&a->lp[i], &b->lp[i], 4) != 0;
    return (double)d;
}

/* where a and b differ, printed when they do: the first entry's group, response and token, the
 * tokens that differ, the entries with equal tokens and other logprob bits, and the largest
 * logprob difference among those (a rounding-sized one is another sum order, a large one other
 * inputs) */
static void roll_where(const char *what, const roll *a, const roll *b) {
    if (roll_diff(a, b) == 0) return;
    if (a->n != b->n) {
        printf("%s: %d vs %d entries\n", what, a->n, b->n);
        return;
    }
    int first = -1, ntok = 0, nlp = 0, g0 = 0;
    double mx = 0;
    for (int i = 0; i < a->n; i++) {
        int dt = a->tok[i] != b->tok[i], dl = !dt && memcmp(&a->lp[i], &b->lp[i], 4) != 0;
        if ((dt || dl) && first < 0) first = i;
        if ((dt || dl) && a->at[i][2] == 0) g0++;
        ntok += dt;
        nlp += dl;
        if (dl) mx = fmax(mx, fabs((double)a->lp[i] - b->lp[i]));
    }
    printf("%s: first difference at group %d response %d token %d; %d tokens differ, %d logprobs alone (max |d| %.3e); "
           "%d of the differing are first tokens\n",
           what, a->at[first][0], a->at[first][1], a->at[first][2], ntok, nlp, mx, g0);
}

/* ---------------------------------------------------------------- one engine's run */

typedef struct {
    const unsigned char *id; /* NCCL's (EP over it), or NULL */
    comm *c; /* or a comm of the caller's (EP over it: the staged comm below); both NULL: no EP */
    int rank, world, device, train, save;
    int offload; /* 1: the optimizer state in host memory (--optimizer-offload on) */
    const char *resume;
    int *cancel; /* set when this rank fails to open: the other's NCCL set-up ends (may be NULL) */
    pthread_barrier_t *bar; /* staged comm: the ranks meet after each rollout (may be NULL) */
    eng *e;
    roll r0, r1; /* before and after the updates */
    roll rs; /* with a barrier: a rollout before the updates, the other ranks idle meanwhile */
    float *dw; /* the weights rollouts decode with (n_whole), after the open */
    long long dw_moved; /* of them, read again after the rollouts before the updates: differing (-1: not read) */
    float lp0[NPROBE];
    int n_lp;
    eng_update_result u[NSTEP];
    float *st[3]; /* the whole master, m, v after the updates (rank 0) */
    int rc;
    char msg[256];
} run_job;

static void *run_main(void *p) {
    run_job *j = p;
    eng_open_opts o = {.model_dir = MODEL,
                       .backend = "cuda",
                       .device = j->device,
                       .nccl_id = j->id,
                       .comm = j->c,
                       .rank = j->rank,
                       .world = j->world,
                       .expert_parallel = j->id || j->c,
                       .resume_dir = j->resume,
                       .nccl_cancel = j->cancel,
                       .optimizer_offload = j->offload ? "on" : "off"}; /* not the plan's: a GPU shared with
                                                                        * other programs would move it */
    j->rc = eng_open(&o, &j->e);
    if (j->rc && j->cancel) __atomic_store_n(j->cancel, 1, __ATOMIC_RELEASE);
    if (!j->rc && (j->dw = calloc((size_t)n_whole, 4))) j->rc = eng_testing_dec_weights(j->e, j->dw);
    if (!j->rc) j->rc = rollout(j->e, &j->r0);
    if (j->bar) pthread_barrier_wait(j->bar);
    for (int q = 0; j->bar && q < j->world; q++) { /* one rank at a time */
        if (q == j->rank && !j->rc) j->rc = rollout(j->e, &j->rs);
        pthread_barrier_wait(j->bar);
    }
    j->dw_moved = -1;
    float *again = j->dw && !j->rc ? calloc((size_t)n_whole, 4) : NULL;
    if (again && !(j->rc = eng_testing_dec_weights(j->e, again))) { /* did a rollout write into the weights? */
        j->dw_moved = 0;
        for (long long i = 0; i < n_whole; i++) j->dw_moved += memcmp(&again[i], &j->dw[i], 4) != 0;
    }
    free(again);
    if (!j->rc && j->train) j->rc = (j->n_lp = probe(j->e, j->lp0)) < 0;
    for (int s = 0; s < NSTEP && !j->rc && j->train; s++) j->rc = update(j->e, &j->u[s]);
    if (!j->rc && j->train) j->rc = rollout(j->e, &j->r1);
    if (j->bar && j->train) pthread_barrier_wait(j->bar);
    for (int i = 0; i < 3; i++) j->st[i] = calloc((size_t)n_whole, 4);
    if (!j->rc) j->rc = eng_testing_state(j->e, j->st[0], j->st[1], j->st[2]);
    if (!j->rc && j->save) j->rc = eng_checkpoint_save(j->e, CKPT);
    snprintf(j->msg, sizeof j->msg, "%s", j->rc ? err_msg() : "");
    return NULL;
}

static void run_free(run_job *j) {
    if (j->e) eng_close(j->e);
    for (int i = 0; i < 3; i++) free(j->st[i]);
    free(j->dw);
}

static double rel(double a, double b) { return fabs(a - b) / (fabs(b) > 1e-30 ? fabs(b) : 1e-30); }

static double update_rel_l2(const float *a, const float *b, const float *w0, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i], u = (double)b[i] - (w0 ? w0[i] : 0);
        num += d * d;
        den += u * u;
    }
    return sqrt(num / (den > 0 ? den : 1e-30));
}

/* the worst relative loss / grad norm difference of x's updates from r's */
static double update_diff(const run_job *x, const run_job *r, const char *what) {
    double worst = 0;
    for (int s = 0; s < NSTEP; s++) {
        printf("%s update %d: loss %.7f vs %.7f, grad_norm %.6f vs %.6f, micro-batches %d vs %d\n", what, s, x->u[s].loss,
               r->u[s].loss, x->u[s].grad_norm, r->u[s].grad_norm, x->u[s].micro_batches, r->u[s].micro_batches);
        worst = fmax(worst, fmax(rel(x->u[s].loss, r->u[s].loss), rel(x->u[s].grad_norm, r->u[s].grad_norm)));
    }
    return worst;
}

/* ---------------------------------------------------------------- (a) W = 1 */

/* (a) with the optimizer offloaded (train/state.c: the shard's and the experts' master and
 * moments in host memory, AdamW on the host): the same two updates against the EP engine x with
 * the state on the device — loss and grad norm within LOSS_TOL, the weights' update and both
 * moments within 2e-2 relative L2 (the host AdamW rounds without nvcc's fused multiply-adds,
 * test_offload's 1e-6 a step, magnified by the normalised steps as above; a shard's state
 * stepped at the wrong place is O(1)); its checkpoint resumed without EP bit-equal (master, m,
 * v) and its rollouts after the update bit-equal to that checkpoint's (the bf16 weights the host
 * uploaded are the master's rounding). */
/* The checkpoint x saved, resumed by an engine without EP: master, m and v bit-equal to x's,
 * and its rollouts equal to x's after the update (rows named "<tag>: ...") */
static void resume_rows(const char *tag, const run_job *x) {
    char name[2][160];
    snprintf(name[0], sizeof name[0], "%s: checkpoint resumed without EP", tag);
    snprintf(name[1], sizeof name[1], "%s: rollouts after the update", tag);
    run_job y = {.resume = CKPT};
    run_main(&y);
    if (y.rc) {
        printf("resume without EP: %s\n", y.msg);
        gc_row(name[0], "engine failed", NAN, 0);
    } else {
        long long d = 0;
        for (int i = 0; i < 3; i++) d += memcmp(x->st[i], y.st[i], (size_t)n_whole * 4) != 0;
        gc_row(name[0], "master, m, v vectors not bit-equal", (double)d, 0);
        roll_where(name[1], &x->r1, &y.r0);
        gc_row(name[1], "decode copy vs its checkpoint without EP; differing", roll_diff(&x->r1, &y.r0), 0);
    }
    run_free(&y);
}

static void w1_offload_rows(const run_job *x, const float *w0) {
    unsigned char id[128];
    if (comm_nccl_unique_id(id)) gc_die(NULL, "unique id");
    eng_remove_tree(CKPT);
    run_job o = {.id = id, .world = 1, .train = 1, .save = 1, .offload = 1};
    run_main(&o);
    eng_info in = {0};
    if (!o.rc) eng_get_info(o.e, &in);
    if (o.rc || strcmp(in.plan.optimizer, "host")) {
        printf("ep W=1 offload engine: %s (optimizer %s)\n", o.msg, in.plan.optimizer);
        gc_row("ep W=1 cuda offload", "engine failed or optimizer not on the host", NAN, 0);
        run_free(&o);
        return;
    }
    gc_row("ep W=1 cuda offload: loss and grad_norm", "2 updates vs EP on the device, max relative difference",
           update_diff(&o, x, "ep W=1 offload"), LOSS_TOL);
    double dw = update_rel_l2(o.st[0], x->st[0], w0, (size_t)n_whole), dm = rel_l2(o.st[1], x->st[1], (size_t)n_whole),
           dv = rel_l2(o.st[2], x->st[2], (size_t)n_whole);
    printf("ep W=1 offload vs on the device: weights' update rel L2 %.3e, m %.3e, v %.3e\n", dw, dm, dv);
    gc_row("ep W=1 cuda offload: master, m, v", "vs EP on the device; worst rel L2 (update for the master)",
           fmax(dw, fmax(dm, dv)), 2e-2);
    resume_rows("ep W=1 cuda offload", &o);
    run_free(&o);
}

static void w1_rows(const run_job *ref, const float *w0) {
    unsigned char id[128];
    if (comm_nccl_unique_id(id)) gc_die(NULL, "unique id");
    eng_remove_tree(CKPT);
    run_job x = {.id = id, .world = 1, .train = 1, .save = 1};
    run_main(&x);
    if (x.rc) {
        printf("ep W=1 engine: %s\n", x.msg);
        gc_row("ep W=1 cuda vs no EP", "engine failed", NAN, 0);
        run_free(&x);
        return;
    }
    gc_row("ep W=1 cuda: rollouts before the update", "decode copy vs no EP; tokens+logprobs differing",
           roll_diff(&x.r0, &ref->r0), 0);
    double mean = 0, mx = 0;
    for (int i = 0; i < x.n_lp; i++) {
        double d = fabs(x.lp0[i] - ref->lp0[i]);
        mean += d / x.n_lp;
        mx = fmax(mx, d);
    }
    printf("ep W=1 logprobs vs no EP: mean |d| %.3e, max |d| %.3e (%d tokens)\n", mean, mx, x.n_lp);
    gc_row("ep W=1 cuda: logprobs", "one rank runs the MoE op; max abs difference", x.n_lp == ref->n_lp ? mx : NAN, 0);
    gc_row("ep W=1 cuda: loss and grad_norm", "2 updates, aux 0.1, max relative difference", update_diff(&x, ref, "ep W=1"),
           LOSS_TOL);
    printf("ep W=1 weights' update vs no EP: rel L2 %.3e\n", update_rel_l2(x.st[0], ref->st[0], w0, (size_t)n_whole));

    /* its checkpoint on an engine without EP: the state bit-equal, the rollouts too */
    resume_rows("ep W=1 cuda", &x);
    gc_row("ep W=1 cuda: the rollouts changed", "after vs before the update; 0 = changed", (double)(roll_diff(&x.r1, &x.r0) == 0),
           0);
    w1_offload_rows(&x, w0);
    run_free(&x);
}

/* ---------------------------------------------------------------- (b) W = 2 */

static void w2_rows(const run_job *ref) {
    /* EP_SAME_GPU=1 on one GPU: try both ranks on device 0 (NCCL usually refuses: a SKIP row
     * with its message) */
    int same = eng_device_count() < 2 && getenv("EP_SAME_GPU") && eng_device_count() == 1;
    if (eng_device_count() < 2 && !same) {
        printf("ROW|ep W=2 cuda (NCCL all-to-all-v)|%d GPU visible: needs 2 (NCCL refuses two ranks on one)|nan|1e-02|SKIP\n",
               eng_device_count());
        return;
    }
    unsigned char id[128];
    if (comm_nccl_unique_id(id)) gc_die(NULL, "unique id");
    int cancel = 0;
    run_job j[2] = {{.id = id, .rank = 0, .world = 2, .device = 0, .train = 1, .cancel = &cancel},
                    {.id = id, .rank = 1, .world = 2, .device = same ? 0 : 1, .train = 1, .cancel = &cancel}};
    gc_threads(run_main, j, sizeof j[0], 2);
    if (same && (!j[0].e || !j[1].e)) {
        printf("ep W=2 on one GPU: %s / %s\n", j[0].msg, j[1].msg);
        printf("ROW|ep W=2 cuda, both ranks on GPU 0|NCCL would not open two ranks on one GPU|nan|1e-02|SKIP\n");
        for (int q = 0; q < 2; q++) run_free(&j[q]);
        return;
    }
    for (int q = 0; q < 2; q++) {
        char what[64];
        snprintf(what, sizeof what, "ep W=2 cuda rank %d", q);
        if (j[q].rc) {
            printf("%s: %s\n", what, j[q].msg);
            gc_row(what, "engine failed", NAN, 1e-2);
            continue;
        }
        char row[96];
        snprintf(row, sizeof row, "%s: loss and grad_norm", what);
        gc_row(row, "2 updates vs one GPU without EP", update_diff(&j[q], ref, what), LOSS_TOL);
        snprintf(row, sizeof row, "%s: rollouts before the update", what);
        gc_row(row, "decode copy (NCCL gathered) vs no EP; differing", roll_diff(&j[q].r0, &ref->r0), 0);
    }
    for (int q = 0; q < 2; q++) run_free(&j[q]);
}

/* ---------------------------------------------------------------- (c) W = 2 on one GPU */

/* NCCL refuses two ranks on one device, so this comm (tests only) runs the cpu comm's
 * collectives (comm_cpu.c: the same meaning, rank-order sums) on host copies of the ranks'
 * device buffers: the whole device's work is finished first (cudaDeviceSynchronize: both ranks'
 * streams), the inputs copied down, the outputs up. It exercises every exchange of expert
 * parallelism on cuda between two ranks (plans, row packing, the experts on received rows, the
 * combine) except NCCL's transport, which test_comm_nccl covers. A device synchronization while
 * the other rank captures a decode graph would break its capture: the ranks meet after each
 * rollout (run_job.bar), so comm calls never overlap a rollout. */
typedef struct {
    comm *inner;
} staged;

static int st_down(void **h, const void *d, size_t b) {
    *h = malloc(b + 1);
    if (!*h) return err_set(GE_NOMEM, "staged comm: out of memory");
    if (cudaDeviceSynchronize() != cudaSuccess || (b && cudaMemcpy(*h, d, b, cudaMemcpyDeviceToHost) != cudaSuccess))
        return err_set(GE_COMM, "staged comm: %s", cudaGetErrorString(cudaGetLastError()));
    return 0;
}
static int st_up(void *d, const void *h, size_t b, int rc) {
    /* the engine's stream is non-blocking: wait for the copy itself before it runs on */
    if (!rc && b && (cudaMemcpy(d, h, b, cudaMemcpyHostToDevice) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess))
        rc = err_set(GE_COMM, "staged comm: %s", cudaGetErrorString(cudaGetLastError()));
    return rc;
}
#define INNER(c) (((staged *)(c)->impl)->inner)

static int st_all_reduce(comm *c, void *buf, size_t n, comm_type t) {
    size_t b = n * comm_type_bytes(t);
    void *h;
    int rc = st_down(&h, buf, b);
    rc = st_up(buf, h, b, rc ? rc : comm_all_reduce_sum(INNER(c), h, n, t));
    free(h);
    return rc;
}
static int st_reduce_scatter(comm *c, const void *in, void *out, size_t n, comm_type t) {
    size_t b = n * comm_type_bytes(t);
    void *h, *o = malloc(b + 1);
    int rc = st_down(&h, in, b * (size_t)c->size);
    rc = st_up(out, o, b, rc ? rc : comm_reduce_scatter_sum(INNER(c), h, o, n, t));
    free(h);
    free(o);
    return rc;
}
static int st_all_gather(comm *c, const void *in, void *out, size_t n, comm_type t) {
    size_t b = n * comm_type_bytes(t);
    void *h, *o = malloc(b * (size_t)c->size + 1);
    int rc = st_down(&h, in, b);
    rc = st_up(out, o, b * (size_t)c->size, rc ? rc : comm_all_gather(INNER(c), h, o, n, t));
    free(h);
    free(o);
    return rc;
}
static int st_broadcast(comm *c, void *buf, size_t n, comm_type t, int root) {
    size_t b = n * comm_type_bytes(t);
    void *h;
    int rc = st_down(&h, buf, b);
    rc = st_up(buf, h, b, rc ? rc : comm_broadcast(INNER(c), h, n, t, root));
    free(h);
    return rc;
}
static int st_all_to_all_v(comm *c, const void *in, const size_t *send, void *out, const size_t *recv, comm_type t) {
    size_t eb = comm_type_bytes(t), ns = 0, nr = 0;
    for (int q = 0; q < c->size; q++) ns += send[q], nr += recv[q];
    void *h, *o = malloc(nr * eb + 1);
    int rc = st_down(&h, in, ns * eb);
    rc = st_up(out, o, nr * eb, rc ? rc : comm_all_to_all_v(INNER(c), h, send, o, recv, t));
    free(h);
    free(o);
    return rc;
}
static int st_barrier(comm *c) { return comm_barrier(INNER(c)); }
static void st_abort(comm *c) { comm_abort(INNER(c)); }
static void st_free(comm *c) {
    comm_free(INNER(c));
    free(c->impl);
    free(c);
}
static const comm_ops staged_ops = {st_all_reduce,   st_reduce_scatter, st_all_gather, st_broadcast,
                                    st_all_to_all_v, st_barrier,        st_abort,      st_free};

/* Two ranks on threads on one GPU: with ep, expert parallelism over the staged comm; without,
 * two engines without it at once (no comm). train 0: the rollouts alone. */
static void staged_rows(const run_job *ref, int ep, int train) {
    comm *inner[2], *c[2] = {NULL, NULL};
    if (ep && comm_cpu_group(2, inner)) gc_die(NULL, "cpu comm");
    for (int q = 0; ep && q < 2; q++) {
        c[q] = calloc(1, sizeof *c[q]);
        staged *x = calloc(1, sizeof *x);
        x->inner = inner[q];
        *c[q] = (comm){&staged_ops, q, 2, x};
    }
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, 2);
    run_job j[2] = {{.c = c[0], .rank = 0, .world = 2, .train = train, .bar = &bar},
                    {.c = c[1], .rank = 1, .world = 2, .train = train, .bar = &bar}};
    gc_threads(run_main, j, sizeof j[0], 2);
    for (int q = 0; q < 2; q++) {
        char what[64], row[96];
        snprintf(what, sizeof what, ep ? "ep W=2 cuda, one GPU, rank %d" : "no EP, two engines on one GPU, #%d", q);
        if (j[q].rc) {
            printf("%s: %s\n", what, j[q].msg);
            gc_row(what, ep ? "engine failed (staged cpu comm)" : "engine failed", NAN, 1e-2);
            continue;
        }
        long long dw = 0;
        for (long long i = 0; i < n_whole; i++) dw += memcmp(&j[q].dw[i], &ref->dw[i], 4) != 0;
        snprintf(row, sizeof row, "%s: decode weights", what);
        gc_row(row, ep ? "decode copy vs the weights without EP; differing" : "vs one engine; differing", (double)dw, 0);
        snprintf(row, sizeof row, "%s: decode weights after rollouts", what);
        gc_row(row, "read again after the rollouts vs after the open; differing", (double)j[q].dw_moved, 0);
        snprintf(row, sizeof row, "%s: rollouts before the update", what);
        roll_where(row, &j[q].rs, &ref->r0);
        gc_row(row, ep ? "one rank at a time, decode copy vs no EP; differing" : "one at a time vs one engine; differing",
               roll_diff(&j[q].rs, &ref->r0), 0);
        snprintf(row, sizeof row, "%s: rollouts both at once", what);
        roll_where(row, &j[q].r0, &ref->r0);
        gc_row(row, "two engines decoding together on one GPU vs one; differing", roll_diff(&j[q].r0, &ref->r0), 0);
        if (!train) continue;
        snprintf(row, sizeof row, "%s: loss and grad_norm", what);
        gc_row(row, "2 updates vs no EP (staged cpu comm)", update_diff(&j[q], ref, what), LOSS_TOL);
        double mean = 0;
        for (int i = 0; i < j[q].n_lp; i++) mean += fabs(j[q].lp0[i] - ref->lp0[i]) / j[q].n_lp;
        snprintf(row, sizeof row, "%s: logprobs", what);
        gc_row(row, "moe_ep over 2 ranks vs the MoE op; mean abs difference", j[q].n_lp == ref->n_lp ? mean : NAN, 1e-2);
    }
    if (train && !j[0].rc && !j[1].rc)
        printf("ep W=2 one GPU: the ranks' losses %s, rollouts after the update %s\n",
               j[0].u[0].loss == j[1].u[0].loss && j[0].u[1].grad_norm == j[1].u[1].grad_norm ? "bit-equal" : "DIFFER",
               roll_diff(&j[0].r1, &j[1].r1) == 0 ? "bit-equal between the ranks" : "DIFFER between the ranks");
    for (int q = 0; q < 2; q++) run_free(&j[q]);
    for (int q = 0; ep && q < 2; q++) comm_free(c[q]);
    pthread_barrier_destroy(&bar);
}

/* ---------------------------------------------------------------- bench */

/* `test_ep_cuda bench`: the cost of the EP path on one GPU (W = 1: its exchanges are copies, its
 * plan a host round trip a layer) at Qwen3-30B-A3B's layer dims (C 2048, 32 heads, 4 kv, E 128,
 * top-8, Fm 768) with 2 MoE layers and a 32K vocabulary: one update of 4 groups (P 1024, N 16,
 * R 256: 20,480 packed tokens, one micro-batch) and a rollout of 4 groups x 16 x 64 tokens, with
 * and without expert parallelism (medians of 3 after a warm-up). Figures only, no rows. */
#define BMODEL "/tmp/grpod_gpu_ep_bench"
enum { BG = 4, BP = 1024, BN = 16, BR = 256, BNEW = 64 };
static int bprompt[BG][BP], bresp[BG][BN][BR], bR[BG][BN];
static const int *brespp[BG][BN];
static float breward[BG][BN];

static void bench_model(void) {
    model_config c;
    if (config_load(FIX, &c)) gc_die(NULL, "fixture config");
    c.L = 2, c.C = 2048, c.H = 32, c.K = 4, c.D = 128, c.E = 128, c.top_k = 8, c.Fm = 768, c.V = 32768, c.max_pos = 4096;
    c.aux_coef = 0.001f;
    for (int l = 0; l < c.L; l++) c.mlp[l] = MLP_MOE;
    printf("bench model: %.2fB parameters (2 MoE layers at 30B-A3B dims, V 32768)\n", write_model(&c, BMODEL, 0.02f, 77, 1) / 1e9);
    unsigned long long sd = 5;
    for (int i = 0; i < BG; i++) {
        for (int t = 0; t < BP; t++) bprompt[i][t] = 3 + (int)((check_randf(&sd, 0.5f) + 0.5f) * 32000);
        for (int r = 0; r < BN; r++) {
            bR[i][r] = BR;
            for (int t = 0; t < BR; t++) bresp[i][r][t] = 3 + (int)((check_randf(&sd, 0.5f) + 0.5f) * 32000);
            brespp[i][r] = bresp[i][r];
            breward[i][r] = check_randf(&sd, 0.5f) + 0.5f;
        }
    }
}

static double bench_median(double *t, int n) {
    qsort(t, (size_t)n, sizeof(double), gc_cmpd);
    return t[n / 2];
}

static void bench_one(int ep) {
    unsigned char id[128];
    if (ep && comm_nccl_unique_id(id)) gc_die(NULL, "unique id");
    eng_open_opts o = {
        .model_dir = BMODEL, .backend = "cuda", .nccl_id = ep ? id : NULL, .world = 1, .expert_parallel = ep, .snapshot = "none"};
    eng *e;
    if (eng_open(&o, &e)) {
        printf("bench %s: %s\n", ep ? "ep W=1" : "no EP", err_msg());
        return;
    }
    eng_update_group g[BG];
    for (int i = 0; i < BG; i++)
        g[i] = (eng_update_group){.prompt = bprompt[i], .P = BP, .n = BN, .resp = brespp[i], .R = bR[i], .reward = breward[i]};
    loss_config a;
    eng_optim opt;
    loss_config_default(&a);
    eng_optim_default(&opt);
    a.adv = ADV_GRPO;
    double tu[4], tr[4];
    eng_update_result u;
    for (int k = 0; k < 4; k++) {
        double t0 = gc_now();
        if (eng_update(e, g, BG, &a, &opt, 1 << 16, &u, NULL, NULL)) {
            printf("bench update: %s\n", err_msg());
            break;
        }
        tu[k] = gc_now() - t0;
        eng_rollout_group rg[BG];
        for (int i = 0; i < BG; i++) rg[i] = (eng_rollout_group){bprompt[i], BP, BN};
        eng_sampling sp;
        fixed_sampling(&sp, 1.0f, BNEW, 3);
        eng_group_result out[BG];
        t0 = gc_now();
        if (eng_rollout(e, rg, BG, &sp, out, NULL, NULL)) {
            printf("bench rollout: %s\n", err_msg());
            break;
        }
        tr[k] = gc_now() - t0;
        for (int i = 0; i < BG; i++) eng_group_result_free(&out[i]);
    }
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    printf("bench %-7s update %.1f ms (%.0f packed tokens/s), rollout %.1f ms (%d x %d x %d tokens), device in use %.1f GiB\n",
           ep ? "ep W=1" : "no EP", 1e3 * bench_median(tu + 1, 3), BG * (BP + BN * BR) / bench_median(tu + 1, 3),
           1e3 * bench_median(tr + 1, 3), BG, BN, BNEW, (double)(tot - fr) / (1 << 30));
    eng_close(e);
}


/* ---------------------------------------------------------------- scale */

/* `test_ep_cuda scale W L [V G P N R NEW]`: expert parallelism over W GPUs of this host (one
 * engine a GPU on its own thread, one NCCL comm; W = 1 also runs the engine without EP) on a
 * random model of Qwen3-30B-A3B's dims with L MoE layers (every layer MoE, vocabulary V,
 * default 151936, untied). Each rank makes the same update of G groups [P; N x R] (GRPO, kl 0.001
 * to the reference pass, one optimizer step, the memory plan's micro-batches) and decodes its
 * share of G groups x N x NEW tokens (temperature 1). Step 0 warms up; the median of steps 1..3
 * of the slowest rank is reported: update and rollout time, packed tokens/s/GPU (P + NR) and
 * N(P + R) tokens/s/GPU, MFU on the active parameters (old + reference forward and the policy's
 * forward + backward = 5 forward passes over the packed tokens, attention included, against
 * 989 TFLOP/s bf16 dense a GPU), and the most device memory in use on any rank. One SCALE| line
 * a configuration; figures only, no rows. tests/gpu/ep_multi.sh runs it over W = 1, 2, 4. */
#define SMODEL "/tmp/grpod_gpu_ep_scale"
enum { SREPS = 4 };
static int sW = 1, sL = 2, sV = 151936, sG = 8, sP = 1024, sN = 16, sR = 512, sNEW = 64;
static int **sprompt, *sRv;
static const int **sresp;
static float *sreward;
static model_config scfg;

static void scale_model(void) {
    model_config c;
    if (config_load(FIX, &c)) gc_die(NULL, "fixture config");
    c.L = sL, c.V = sV, c.max_pos = 40960, c.tied = 0, c.aux_coef = 0.001f;
    gc_moe_30b_a3b(&c, sL);
    double t0 = gc_now();
    long long n = write_model(&c, SMODEL, 0.02f, 77, 1);
    printf("scale model: %.2fB parameters (%d MoE layers at Qwen3-30B-A3B dims, V %d), written in %.0f s\n", n / 1e9, sL, sV,
           gc_now() - t0);
    scfg = c;
    unsigned long long sd = 5;
    sprompt = malloc((size_t)sG * sizeof *sprompt);
    sresp = malloc((size_t)sG * sN * sizeof *sresp);
    sRv = malloc((size_t)sG * sN * sizeof *sRv);
    sreward = malloc((size_t)sG * sN * sizeof *sreward);
    for (int i = 0; i < sG; i++) {
        gc_random_ids(sprompt[i] = malloc((size_t)sP * 4), sP, &sd);
        for (int t = 0; t < sP; t++) sprompt[i][t] %= sV; /* a smaller vocabulary (ep_multi.sh V) */
        for (int r = 0; r < sN; r++) {
            int *x = malloc((size_t)sR * 4);
            gc_random_ids(x, sR, &sd);
            for (int t = 0; t < sR; t++) x[t] %= sV;
            sresp[i * sN + r] = x;
            sRv[i * sN + r] = sR;
            sreward[i * sN + r] = check_randf(&sd, 0.5f) + 0.5f;
        }
    }
}

typedef struct {
    const unsigned char *id; /* NULL: the engine without EP (W = 1) */
    int rank, W;
    pthread_barrier_t *bar;
    int *stop; /* shared: set by a rank that failed; the others end at the next barrier */
    double tu[SREPS], tr[SREPS], peak;
    int rc;
    char msg[256];
} scale_job;

static double mem_in_use(void) {
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    return (double)(tot - fr);
}

static void *scale_main(void *p) {
    scale_job *j = p;
    eng_open_opts o = {.model_dir = SMODEL,
                       .backend = "cuda",
                       .device = j->rank,
                       .nccl_id = j->id,
                       .rank = j->rank,
                       .world = j->W,
                       .expert_parallel = j->id != NULL,
                       .snapshot = "none",
                       .optimizer_offload = getenv("EP_OFFLOAD"), /* on / off (unset: the plan's choice) */
                       .optimizer_moments = getenv("EP_MOMENTS"), /* fp32 / bf16 (unset: fp32) */
                       .nccl_cancel = j->stop};
    eng *e = NULL;
    if ((j->rc = eng_open(&o, &e))) {
        __atomic_store_n(j->stop, 1, __ATOMIC_RELEASE);
        snprintf(j->msg, sizeof j->msg, "%s", err_msg());
    }
    if (e && j->rank == 0) { /* the engine's memory plan of rank 0 (every rank's is the same size) */
        eng_info in;
        eng_get_info(e, &in);
        const eng_plan *pl = &in.plan;
        printf("SCALE plan|%s W=%d L=%d|weights %.1f GiB (decode stacks past the gradients included)|reference %.1f|gradients "
               "%.1f|master %.1f, moments %.1f on the device|host state %.1f|optimizer %s|activations budget %.1f, KV %.1f|"
               "micro-batch %lld tokens\n",
               j->id ? "EP" : "no EP", j->W, sL, pl->weights / 1073741824.0, pl->reference / 1073741824.0,
               pl->gradients / 1073741824.0, pl->master / 1073741824.0, pl->moments / 1073741824.0, pl->host_state / 1073741824.0,
               pl->optimizer, pl->acts_bytes / 1073741824.0, pl->kv_bytes / 1073741824.0, pl->micro_batch_tokens);
        fflush(stdout);
    }
    eng_update_group *g = calloc((size_t)sG, sizeof *g);
    eng_rollout_group *rg = calloc((size_t)sG, sizeof *rg);
    eng_group_result *out = calloc((size_t)sG, sizeof *out);
    int *gi = calloc((size_t)sG, sizeof *gi), *at = calloc((size_t)sG, sizeof *at), nr = 0;
    long long *kv = calloc((size_t)sG, sizeof *kv);
    for (int i = 0; i < sG; i++) {
        g[i] = (eng_update_group){
            .prompt = sprompt[i], .P = sP, .n = sN, .resp = sresp + i * sN, .R = sRv + i * sN, .reward = sreward + i * sN};
        kv[i] = sP + (long long)sN * sNEW;
    }
    eng_place_groups(kv, sG, j->W, at); /* this rank's rollouts: its share, each with its request index */
    for (int i = 0; i < sG; i++)
        if (at[i] == j->rank) gi[nr] = i, rg[nr++] = (eng_rollout_group){sprompt[i], sP, sN};
    loss_config a;
    eng_optim opt;
    loss_config_default(&a);
    eng_optim_default(&opt);
    a.adv = ADV_GRPO;
    a.kl_coef = 0.001f;
    opt.lr = 1e-5f;
    eng_info inf = {0};
    if (e) eng_get_info(e, &inf);
    long long mbt = sP + (long long)sN * sR; /* a group in one micro-batch (EP does not split groups) */
    if (inf.plan.micro_batch_tokens > mbt) mbt = inf.plan.micro_batch_tokens;
    for (int k = 0; k < SREPS; k++) {
        pthread_barrier_wait(j->bar); /* every rank meets here each step, a failed one too */
        if (__atomic_load_n(j->stop, __ATOMIC_ACQUIRE)) break;
        double t0 = gc_now();
        eng_update_result u;
        eng_sampling sp;
        fixed_sampling(&sp, 1.0f, sNEW, 3);
        sp.group_index = gi;
        if (!(j->rc = eng_update(e, g, sG, &a, &opt, mbt, &u, NULL, NULL))) {
            j->tu[k] = gc_now() - t0;
            j->peak = fmax(j->peak, mem_in_use());
            t0 = gc_now();
            j->rc = eng_rollout(e, rg, nr, &sp, out, NULL, NULL);
        }
        if (j->rc) {
            snprintf(j->msg, sizeof j->msg, "%s", err_msg());
            __atomic_store_n(j->stop, 1, __ATOMIC_RELEASE);
            continue;
        }
        j->tr[k] = gc_now() - t0;
        j->peak = fmax(j->peak, mem_in_use());
        for (int i = 0; i < nr; i++) eng_group_result_free(&out[i]);
    }
    if (j->rc && !j->msg[0]) snprintf(j->msg, sizeof j->msg, "%s", err_msg());
    if (e) eng_close(e);
    free(g), free(rg), free(out), free(gi), free(at), free(kv);
    return NULL;
}

/* forward FLOPs of G groups on the active parameters, attention included (bench_step's count) */
static double scale_fwd_flops(void) {
    const model_config *c = &scfg;
    double hd = (double)c->H * c->D, mlp = 3.0 * c->C * c->Fm * c->top_k + (double)c->C * c->E;
    double lay = (double)c->C * hd * 2 + 2.0 * c->C * c->K * c->D + mlp;
    double att = 2.0 * sP * sP * hd + 4.0 * sN * sR * (sP + sR / 2.0) * hd;
    return sG * (2 * lay * c->L * (sP + (double)sN * sR) + 2.0 * c->C * c->V * sN * sR + c->L * att);
}

static void scale_run(int W, int ep) {
    unsigned char id[128];
    if (ep && comm_nccl_unique_id(id)) gc_die(NULL, "unique id");
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)W);
    int stop = 0;
    scale_job *j = calloc((size_t)W, sizeof *j);
    for (int q = 0; q < W; q++) j[q] = (scale_job){.id = ep ? id : NULL, .rank = q, .W = W, .bar = &bar, .stop = &stop};
    gc_threads(scale_main, j, sizeof *j, W);
    double tu[SREPS - 1], tr[SREPS - 1], peak = 0;
    int bad = 0;
    for (int k = 1; k < SREPS; k++) {
        tu[k - 1] = tr[k - 1] = 0;
        for (int q = 0; q < W; q++) tu[k - 1] = fmax(tu[k - 1], j[q].tu[k]), tr[k - 1] = fmax(tr[k - 1], j[q].tr[k]);
    }
    for (int q = 0; q < W; q++) {
        peak = fmax(peak, j[q].peak);
        if (j[q].rc || stop) printf("scale W=%d rank %d: %s\n", W, q, j[q].msg), bad = 1;
    }
    const char *what = ep ? "EP" : "no EP";
    if (bad) {
        printf("SCALE|%s W=%d L=%d|P %d N %d R %d G %d|failed\n", what, W, sL, sP, sN, sR, sG);
    } else {
        double u = bench_median(tu, SREPS - 1), r = bench_median(tr, SREPS - 1);
        double packed = (double)sG * (sP + (double)sN * sR), full = (double)sG * sN * (sP + sR);
        printf("SCALE|%s W=%d L=%d|P %d N %d R %d G %d|update %.1f ms|%.0f P+NR tok/s/GPU|%.0f N(P+R) tok/s/GPU|MFU %.1f%%|"
               "rollout %.1f ms (%.0f tok/s/GPU)|peak %.1f GiB\n",
               what, W, sL, sP, sN, sR, sG, 1e3 * u, packed / u / W, full / u / W, 100 * 5 * scale_fwd_flops() / u / W / 989e12,
               1e3 * r, (double)sG * sN * sNEW / r / W, peak / (1 << 30));
    }
    fflush(stdout);
    pthread_barrier_destroy(&bar);
    free(j);
}

static int scale_main_args(int argc, char **argv) {
    int *v[] = {&sW, &sL, &sV, &sG, &sP, &sN, &sR, &sNEW};
    for (int i = 2; i < argc && i < 10; i++) *v[i - 2] = atoi(argv[i]);
    if (sW < 1 || sW > eng_device_count() || sL < 1 || sL > 48 || 128 % sW)
        gc_die(NULL, "scale W L: W GPUs (at most the visible ones, dividing 128 experts), L in 1..48");
    scale_model();
    if (sW == 1) scale_run(1, 0);
    scale_run(sW, 1);
    eng_remove_tree(SMODEL);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 2 && !strcmp(argv[1], "scale")) return scale_main_args(argc, argv);
    if (argc > 1 && !strcmp(argv[1], "bench")) {
        bench_model();
        bench_one(0);
        bench_one(1);
        eng_remove_tree(BMODEL);
        return 0;
    }
    make_model();
    make_inputs();
    if (argc > 1 && !strcmp(argv[1], "rollouts")) { /* the rollout rows alone, no update */
        run_job one = {0}, two = {0};
        run_main(&one);
        if (one.rc) gc_die(NULL, "reference");
        run_main(&two); /* the control: one engine alone again */
        roll_where("one engine alone, twice", &two.r0, &one.r0);
        gc_row("one engine alone, twice: rollouts", "second vs first; differing", two.rc ? NAN : roll_diff(&two.r0, &one.r0), 0);
        run_free(&two);
        staged_rows(&one, 0, 0);
        staged_rows(&one, 1, 0);
        run_free(&one);
        return gc_failures ? 1 : 0;
    }
    /* the initial weights (the weights' update is measured from them) */
    run_job init = {0};
    run_main(&init);
    if (init.rc) {
        printf("engine without EP: %s\n", init.msg);
        gc_die(NULL, "reference");
    }
    float *w0 = init.st[0];
    init.st[0] = NULL;
    run_free(&init);
    run_job ref = {.train = 1};
    run_main(&ref);
    if (ref.rc) {
        printf("engine without EP: %s\n", ref.msg);
        gc_die(NULL, "reference");
    }
    w1_rows(&ref, w0);
    staged_rows(&ref, 1, 1);
    w2_rows(&ref);
    run_free(&ref);
    free(w0);
    return gc_failures ? 1 : 0;
}
