/* offload.c — see offload.h. */
#include "engine/train/offload.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/clock.h"
#include "common/err.h"
#include "kernels/adamw.h"

enum { EV_READY = 0, EV_D2H = 1, EV_H2D = 1 + OFFLOAD_STAGES, EV_DONE = 1 + 2 * OFFLOAD_STAGES };

float *offload_host_alloc(long long n) { return offload_host_alloc_from(n, 0); }

float *offload_host_alloc_from(long long n, long long from) {
    /* 2 MiB pages where the kernel gives them, zeroed here by all cores: left to the first
     * AdamW step, 4 KiB page faults on 64 GiB of moments cost ~30 s (measured at 8B dims) */
    const size_t huge = 2u << 20, bytes = ((size_t)(n > 0 ? n : 1) * 4 + huge - 1) & ~(huge - 1);
    void *p = NULL;
    if (posix_memalign(&p, huge, bytes)) {
        err_set(GE_NOMEM, "optimizer offload: cannot allocate %.1f GiB of host memory", bytes / 1073741824.0);
        return NULL;
    }
#ifdef MADV_HUGEPAGE
    madvise(p, bytes, MADV_HUGEPAGE);
#endif
    /* first touch in the pattern of the AdamW's threads (adamw_run: each default chunk split
     * in static blocks of 16 Ki elements), so that on a NUMA host each page sits beside the
     * thread that updates it */
    const long long chunk = OFFLOAD_CHUNK, blk = 16384, total = (long long)(bytes / 4);
    for (long long c0 = from; c0 < total; c0 += chunk) { /* the chunks of a state stepped from `from` */
        long long len = total - c0 < chunk ? total - c0 : chunk, nb = (len + blk - 1) / blk;
#pragma omp parallel for schedule(static)
        for (long long b = 0; b < nb; b++) {
            long long i0 = c0 + b * blk, i1 = i0 + blk < c0 + len ? i0 + blk : c0 + len;
            memset((float *)p + i0, 0, (size_t)(i1 - i0) * 4);
        }
    }
    return p;
}

static void *stage_alloc(eng_backend *be, size_t bytes) {
    if (be->host_alloc) return be->host_alloc(be, bytes);
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes)) {
        err_set(GE_NOMEM, "optimizer offload: no host memory for staging");
        return NULL;
    }
    return p;
}

int offload_init(eng_offload *o, eng_backend *be, long long n, long long chunk) {
    memset(o, 0, sizeof *o);
    o->be = be;
    o->n = n;
    o->chunk = chunk > 0 ? chunk : OFFLOAD_CHUNK;
    if (o->chunk > n) o->chunk = n > 0 ? n : 1;
    for (int s = 0; s < OFFLOAD_STAGES; s++) {
        o->gstage[s] = stage_alloc(be, (size_t)o->chunk * 4);
        o->astage[s] = stage_alloc(be, (size_t)o->chunk * (size_t)be->act_bytes);
        if (!o->gstage[s] || !o->astage[s]) {
            offload_free(o);
            return GE_NOMEM;
        }
    }
    return 0;
}

void offload_free(eng_offload *o) {
    if (!o->be) return;
    for (int s = 0; s < OFFLOAD_STAGES; s++) {
        void *p[2] = {o->gstage[s], o->astage[s]};
        for (int k = 0; k < 2; k++)
            if (p[k]) {
                if (o->be->host_free) o->be->host_free(o->be, p[k]);
                else free(p[k]);
            }
    }
    memset(o, 0, sizeof *o);
}

/* Queue (or, without lanes, do) the download of gradient chunk i into its stage. */
static int fetch(eng_offload *o, long long n, const float *grad, long long i) {
    eng_backend *be = o->be;
    long long off = i * o->chunk, len = n - off < o->chunk ? n - off : o->chunk;
    int s = (int)(i % OFFLOAD_STAGES);
    if (!be->copy_async) return be->to_host(be, o->gstage[s], grad + off, (size_t)len * 4);
    int rc = be->copy_async(be, BE_LANE_D2H, o->gstage[s], grad + off, (size_t)len * 4);
    be->mark(be, BE_LANE_D2H, EV_D2H + s);
    return rc;
}

int offload_adamw(eng_offload *o, long long n, float *master, void *m, void *v, void *w_act, const float *grad, float lr,
                  float beta1, float beta2, float eps, float wd, int step) {
    eng_backend *be = o->be;
    const int lanes = be->copy_async != NULL, eb = be->act_bytes;
    long long nch = (n + o->chunk - 1) / o->chunk;
    int rc = 0;
    o->ms_host = o->ms_wait = 0;
    if (lanes) {
        /* both copy lanes start after what the op stream queued: the backward and the clip
         * (gradients), and every read of the weights about to be replaced */
        be->mark(be, BE_LANE_OPS, EV_READY);
        be->wait(be, BE_LANE_D2H, EV_READY);
        be->wait(be, BE_LANE_H2D, EV_READY);
    }
    for (long long i = 0; i < nch && i < OFFLOAD_STAGES - 1 && !rc; i++) rc = fetch(o, n, grad, i);
    for (long long i = 0; i < nch && !rc; i++) {
        int s = (int)(i % OFFLOAD_STAGES);
        /* the stage of chunk i + S - 1 held chunk i - 1, done on the host by now */
        if (i + OFFLOAD_STAGES - 1 < nch && (rc = fetch(o, n, grad, i + OFFLOAD_STAGES - 1))) break;
        long long off = i * o->chunk, len = n - off < o->chunk ? n - off : o->chunk;
        double t = clock_mono_ms();
        if (lanes && ((rc = be->wait(be, BE_LANE_HOST, EV_D2H + s)) || (rc = be->wait(be, BE_LANE_HOST, EV_H2D + s)))) break;
        double t1 = clock_mono_ms();
        o->ms_wait += t1 - t;
        uint16_t *act = eb == 2 ? o->astage[s] : NULL;
        adamw_bad b;
        if (o->m16)
            b = adamw_m16_cpu(master + off, act, o->gstage[s], (uint16_t *)m + off, (uint16_t *)v + off, len, lr, beta1, beta2,
                              eps, wd, step);
        else if (act)
            b = adamw_bf16_cpu(master + off, act, o->gstage[s], (float *)m + off, (float *)v + off, len, lr, beta1, beta2, eps,
                               wd, step);
        else b = adamw_cpu(master + off, o->gstage[s], (float *)m + off, (float *)v + off, len, lr, beta1, beta2, eps, wd, step);
        o->bad.w += b.w;
        o->bad.v += b.v;
        if (!act) memcpy(o->astage[s], master + off, (size_t)len * 4);
        o->ms_host += clock_mono_ms() - t1;
        char *dst = (char *)w_act + (size_t)off * (size_t)eb;
        if (!lanes) {
            rc = be->to_dev(be, dst, o->astage[s], (size_t)len * (size_t)eb);
            continue;
        }
        rc = be->copy_async(be, BE_LANE_H2D, dst, o->astage[s], (size_t)len * (size_t)eb);
        be->mark(be, BE_LANE_H2D, EV_H2D + s);
    }
    if (lanes) {
        /* the ops that follow read the new weights: the op stream waits for the last upload */
        be->mark(be, BE_LANE_H2D, EV_DONE);
        int r2 = be->wait(be, BE_LANE_OPS, EV_DONE);
        if (!rc) rc = r2;
    }
    return rc;
}

void offload_host_release(float *p, long long n) {
    const uintptr_t huge = 2u << 20, a = ((uintptr_t)p + huge - 1) & ~(huge - 1), b = ((uintptr_t)(p + n)) & ~(huge - 1);
    if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
}
