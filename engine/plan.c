/* plan.c — the memory plan (engine.h eng_plan), made once at the end of eng_open.
 *
 * Its first choice, whether the optimizer state lives in host memory (plan_offload), is made in
 * eng_open before the fp32 master is placed. By the end of eng_open the weights, the reference
 * and the master are placed, and the plan
 *   1. allocates the gradients and the AdamW moments (device, or host with offload), so that
 *      the free memory it reads next is what every later job shares;
 *   2. places the update's safety copy (train/snapshot.h): on the device when it takes at most
 *      a quarter of what is free beside the headroom; else in pinned host memory when the host
 *      has room for it (with the copies of the other ranks on this host) and SNAP_HOST_RESERVE
 *      beside it; else nowhere. Host state (offload, or the cpu backend) takes a host copy under
 *      the same host rule; a split state (part device, part host) none;
 *   3. reads what is left, less the headroom: acts_bytes. An update runs alone (no KV pool:
 *      the scheduler releases it when no rollout runs) and releases its activations when it
 *      ends, so its micro-batch may use all of it: micro_batch_tokens_max is the most tokens
 *      whose activations, every layer recomputed, and the no-grad passes' fit; the default
 *      micro-batch is the largest up to ENG_MB_TOKENS_DEFAULT that fits;
 *   4. gives the KV pool half of what is left beside one default micro-batch's no-grad
 *      activations (a logprobs job runs between decode steps, with the pool held).
 * On the cpu backend (no device) only the state is sized and the snapshot placed; the budgets
 * stay 0 ("no limit": the scheduler's cpu default, activations on demand). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "engine/engine_internal.h"
#include "engine/model/moe_ep.h"
#include "engine/params.h"
#include "engine/train/state.h"

/* The room the plan leaves beside the activations: the 4 GiB an update keeps free as it runs
 * (engine.c ACTS_HEADROOM, the ops' own scratch), and 1 GiB for what the first steps allocate
 * after the plan is made (kernels loaded on first use, the libraries' workspaces, the decode's
 * buffers and graphs). With 4 GiB counted at both ends nothing was left for those: a 48-layer
 * Qwen3-30B-A3B update on 2 H200s fell 204 MiB short of a micro-batch the plan had allowed. */
#define PLAN_HEADROOM ((long long)5 << 30)
#define SNAP_HOST_RESERVE ((long long)8 << 30) /* host memory left beside a host copy */

/* MemAvailable of /proc/meminfo in bytes; -1 when unknown. */
static long long host_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return -1;
    char line[256];
    long long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
    fclose(f);
    return kb < 0 ? -1 : kb * 1024;
}

long long plan_ep_beside(const eng *e, long long T, size_t held) {
    if (!e->ep_full) return 0;
    size_t call = moe_ep_call_bytes(&e->m, T), scr = moe_ep_beside_bytes(&e->m, T) - call;
    return (long long)(call + (scr > held ? scr - held : 0));
}

/* Device bytes of one micro-batch of T tokens: its grad activations with every layer
 * recomputed, the no-grad passes' (old, reference) within them where they fit, and, under
 * expert parallelism, the exchange's buffers and scratch. */
static long long micro_batch_bytes(const eng *e, long long T) {
    return (long long)model_acts_update_bytes(&e->m, (int)T) + plan_ep_beside(e, T, 0);
}

int eng_offload_mode_check(const char *mode, double *frac) {
    static const struct {
        const char *name;
        double frac; /* the fraction in host memory; < 0: auto */
    } named[] = {{"auto", -1}, {"", -1}, {"on", 1}, {"off", 0}};
    *frac = -1;
    for (size_t k = 0; k < sizeof named / sizeof named[0]; k++)
        if (!mode || !strcmp(mode, named[k].name)) {
            *frac = mode ? named[k].frac : -1;
            return 0;
        }
    char *end = NULL;
    double f = strtod(mode, &end);
    if (end == mode || *end || !(f >= 0 && f <= 1) || strlen(mode) > 15)
        return err_set(GE_INVALID,
                       "optimizer_offload \"%.32s\": auto, on, off, or the fraction of the optimizer state in host memory "
                       "(0 to 1, e.g. 0.6)",
                       mode);
    *frac = f;
    return 0;
}

int eng_moments_check(const char *m, int *m16) {
    *m16 = m && !strcmp(m, "bf16");
    if (!m || !*m || *m16 || !strcmp(m, "fp32")) return 0;
    return err_set(GE_INVALID, "optimizer_moments \"%.32s\": fp32 or bf16 (AdamW's m and v in host memory)", m);
}

/* auto, when the whole host state does not fit this host: as much of it as the host holds (its
 * MemAvailable less SNAP_HOST_RESERVE and PLAN_SPLIT_SLACK, so that the placement's own check a
 * moment later passes), the rest on the device, when that leaves the device room for one
 * micro-batch of PLAN_SPLIT_MB_TOKENS tokens (a 1024-token prompt and six 512-token responses);
 * else a refusal naming both. */
#define PLAN_SPLIT_MB_TOKENS 4096
#define PLAN_SPLIT_SLACK ((long long)1 << 30)
int plan_split_fits(long long n, int act_bytes, long long fr, long long avail, long long mb, const char *dev_name,
                    long long *host_n) {
    *host_n = n;
    if (avail < 0 || !plan_host_state_fits(12 * n, 1, avail)) return 0; /* all of it fits the host */
    long long cap = (avail - SNAP_HOST_RESERVE - PLAN_SPLIT_SLACK) / 12;
    if (cap <= 0) return err_code(); /* no room on the host at all: its refusal */
    err_clear();
    long long d = n - cap, dev = n * act_bytes + 4 * n + 12 * d; /* the policy, the gradients, the device part */
    long long left = fr - dev - PLAN_HEADROOM;
    if (left < mb)
        return err_set(GE_NOMEM,
                       "optimizer offload: the fp32 master and AdamW moments need %lld GiB (12 bytes a parameter); the "
                       "host holds %lld GiB of them (%lld GiB available less %lld GiB kept free) and the rest on %s would "
                       "leave %lld MiB there, less than the %lld MiB of a %d-token micro-batch: spread the model over more "
                       "GPUs or hosts, or train LoRA adapters",
                       12 * n >> 30, 12 * cap >> 30, avail >> 30, SNAP_HOST_RESERVE >> 30, dev_name, left >> 20, mb >> 20,
                       PLAN_SPLIT_MB_TOKENS);
    *host_n = cap;
    return 0;
}

/* The plan's first choice, made in eng_open after the weights and the reference are placed:
 * eng_open_opts.optimizer_offload -> *host_n (engine_internal.h). A fraction f puts the last
 * round(f n) elements in host memory. auto: all on the device unless the fp32 master, gradients
 * and moments (16 bytes a parameter) would leave less than a quarter of the device's memory
 * free; then all in host memory, or with one rank, when the host cannot hold all of it, a split
 * (plan_split_fits). */
int plan_offload(eng *e, const char *mode, long long state_n, long long *host_n) {
    eng_backend *be = e->be;
    double f;
    *host_n = 0;
    int rc = eng_offload_mode_check(mode, &f);
    if (rc) return rc;
    if (f >= 0) {
        *host_n = (long long)(f * (double)state_n + 0.5);
        if (*host_n > state_n) *host_n = state_n;
        if (e->dp && *host_n && *host_n < state_n)
            return err_set(GE_UNSUPPORTED,
                           "optimizer_offload %s: a state split between the device and host memory needs one rank "
                           "(no --world, no expert parallelism): use on or off",
                           mode);
        return 0;
    }
    size_t fr = 0, tot = 0;
    if (!be->mem_info || be->mem_info(be, &fr, &tot)) {
        err_clear();
        return 0;
    }
    double n = (double)e->m.n_elems, st = (double)state_n;
    double need = 4.0 * n + 12.0 * st + n * be->act_bytes; /* + the policy's act copy */
    if (need <= (double)fr - (double)tot / 4) return 0;
    *host_n = state_n;
    return e->dp ? 0
                 : plan_split_fits(state_n, be->act_bytes, (long long)fr, host_available(),
                                   micro_batch_bytes(e, PLAN_SPLIT_MB_TOKENS), be->name, host_n);
}

int plan_full_fits(long long n, int act_bytes, long long dev_total, const char *dev_name, const char *model_dir) {
    long long need = n * (2LL * act_bytes + 4), opt = 12 * n; /* policy, reference, fp32 gradients; master + moments */
    if (dev_total <= 0 || need + PLAN_HEADROOM <= dev_total) return 0;
    return err_set(GE_NOMEM,
                   "%s: full-parameter training of %.1fB parameters needs %lld GiB on %s for the policy, the reference and "
                   "the fp32 gradients (and %lld GiB more for the fp32 master and AdamW moments, on the device or in host "
                   "memory with --optimizer-offload on), beyond its %lld GiB: train LoRA adapters (--lora-rank N; the "
                   "base is then the reference) or spread the model over more GPUs",
                   model_dir, (double)n / 1e9, (need + PLAN_HEADROOM) >> 30, dev_name, opt >> 30, dev_total >> 30);
}

int plan_host_state_fits(long long need, int ranks, long long avail) {
    if (avail < 0 || need + SNAP_HOST_RESERVE <= avail) return 0;
    return err_set(GE_NOMEM,
                   "optimizer offload: the fp32 master and AdamW moments of the %d rank%s on this host need %lld GiB of host "
                   "memory, beyond the %lld GiB available less %lld GiB kept free: spread the model over more GPUs or hosts "
                   "(expert parallelism), hold the moments as bf16 (--optimizer-moments bf16: 8 bytes a parameter, not 12), "
                   "or train LoRA adapters",
                   ranks, ranks == 1 ? "" : "s", need >> 30, avail >> 30, SNAP_HOST_RESERVE >> 30);
}

int plan_host_peers(eng *e) {
    char name[256] = "";
    gethostname(name, sizeof name - 1);
    unsigned long long h = 1469598103934665603ULL, *all = calloc((size_t)e->W, sizeof h); /* FNV-1a of the name */
    for (const char *c = name; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ULL;
    if (!all) { /* the others wait in the exchange: end it */
        comm_abort(e->comm);
        return err_set(GE_NOMEM, "plan: out of memory");
    }
    int rc = dp_exchange(e, &h, all, sizeof h);
    e->host_peers = 0;
    for (int q = 0; !rc && q < e->W; q++) e->host_peers += q != e->rank && all[q] == h;
    free(all);
    return rc;
}

int plan_host_state(eng *e, long long bytes, long long held, long long master) {
    int ranks = 1 + e->host_peers;
    long long avail = host_available();
    /* measured before any rank places its state (dp_agree waits for all): the loaded weights held */
    int rc = plan_host_state_fits(bytes * ranks, ranks, avail < 0 ? avail : avail + held * ranks);
    if (!rc && master) rc = plan_host_state_fits(master * ranks, ranks, avail); /* beside the loaded ones */
    return e->dp ? dp_agree(e, rc) : rc;
}

/* The most tokens in [1, hi] whose micro-batch fits budget; 0 when not even one does. */
static long long fit_tokens(const eng *e, long long budget, long long hi) {
    long long lo = 0;
    while (lo < hi) {
        long long mid = lo + (hi - lo + 1) / 2;
        if (micro_batch_bytes(e, mid) <= budget) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

int plan_make(eng *e, const eng_open_opts *o) {
    eng_plan *p = &e->plan;
    eng_backend *be = e->be;
    memset(p, 0, sizeof *p);
    long long ns = eng_state_n(e);
    int rc = state_alloc(e);
    if (rc) return rc;
    int dev_state = state_footprint(e, p); /* master and moments in device memory */
    p->reference = e->ref_act ? e->m.n_elems * be->act_bytes : 0;
    size_t fr = 0, tot = 0;
    if (be->mem_info && be->mem_info(be, &fr, &tot)) return err_code();
    p->device_total = (long long)tot;
    p->headroom = be->mem_info ? PLAN_HEADROOM : 0;

    long long snap = ns * state_elem_bytes(e), snap_host = snap * (1 + e->host_peers); /* the ranks of this host each place theirs */
    long long host = host_available();
    int where = SNAP_NONE;
    int host_fits = host < 0 || host - snap_host >= SNAP_HOST_RESERVE;
    if (e->host_n) {
        where = SNAP_NONE; /* a split: the copy (snapshot.c) holds one place's state */
    } else if (dev_state) {
        long long room = (long long)fr - p->headroom;
        where = snap <= room / 4 ? SNAP_DEVICE : host_fits && be->host_alloc ? SNAP_PINNED : SNAP_NONE;
    } else if (host_fits) {
        where = SNAP_HOST;
    }
    if (o->snapshot && *o->snapshot && strcmp(o->snapshot, "auto")) { /* the caller's choice */
        where = -1;
        for (int k = SNAP_NONE; k <= SNAP_HOST; k++)
            if (!strcmp(o->snapshot, snap_where_name(k))) where = k;
        int on_dev = where == SNAP_DEVICE || where == SNAP_PINNED;
        if (where < 0 || (where == SNAP_HOST && dev_state) || (on_dev && !dev_state) || (e->host_n && where != SNAP_NONE))
            return err_set(GE_INVALID, "snapshot \"%s\": auto, none, or where the state is (%s)", o->snapshot,
                           e->host_n       ? "none with a split optimizer state"
                               : dev_state ? "device or pinned"
                                           : "host");
        if (where != SNAP_NONE && (rc = snap_alloc(e, where))) return rc;
    } else if (where != SNAP_NONE && snap_alloc(e, where)) {
        err_clear(); /* no room after all: the update runs without a copy (snapshot.h) */
        where = SNAP_NONE;
    }
    p->snapshot = where == SNAP_NONE ? 0 : snap;
    snprintf(p->snapshot_at, sizeof p->snapshot_at, "%s", snap_where_name(where));

    if (!be->mem_info) {
        p->micro_batch_tokens = ENG_MB_TOKENS_DEFAULT;
        return 0;
    }
    if (be->mem_info(be, &fr, &tot)) return err_code();
    long long left = (long long)fr - p->headroom;
    p->acts_bytes = left > 0 ? left : 0;
    p->micro_batch_tokens_max = fit_tokens(e, p->acts_bytes, ENG_MB_TOKENS_MAX);
    if (p->micro_batch_tokens_max < 1)
        return err_set(GE_NOMEM,
                       "%s: no room on %s for the activations of one token once the weights and the training state "
                       "are placed (%lld MiB free): try --optimizer-offload on, LoRA, or more GPUs",
                       o->model_dir, be->name, (long long)fr >> 20);
    p->micro_batch_tokens = p->micro_batch_tokens_max < ENG_MB_TOKENS_DEFAULT ? p->micro_batch_tokens_max : ENG_MB_TOKENS_DEFAULT;
    long long beside = (long long)model_acts_bytes(&e->m, (int)p->micro_batch_tokens, (int)p->micro_batch_tokens, 0, 0);
    p->kv_bytes = left > beside ? (left - beside) / 2 : 0;
    return 0;
}
