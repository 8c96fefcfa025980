/* comm_nccl.cu — the NCCL comm (engine/dist/comm.h), CUDA builds only: one rank per GPU, in one
 * process or many, on one host or several.
 *
 * The communicator is non-blocking (ncclConfig_t.blocking = 0): every call may return
 * ncclInProgress, and this file polls ncclCommGetAsyncError until it settles, so comm_abort
 * (ncclCommAbort, from any thread) can end a collective that waits for a rank that died, which a
 * blocking communicator cannot. Collectives are queued on the backend's op stream (so they follow
 * the ops that produced their inputs) and each call then waits for that stream, polling, so it
 * returns with its output ready or with GE_COMM — the same contract as the cpu comm.
 * Sums are NCCL's: fp32 (ncclFloat32), bf16 (ncclBfloat16: NCCL reduces in bf16 on the wire with
 * its own accumulation order), int32. Copies (all-gather, broadcast) move bytes (ncclUint8), so
 * every type is bit-exact there. The order of a sum is NCCL's ring/tree, the same on every rank of
 * one call: the result is identical across ranks, and from run to run on the same topology.
 * Threading: the engine thread that owns the backend; comm_abort from any thread. */
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>
#include <nccl.h>

extern "C" {
#include "common/err.h"
#include "engine/backend/backend.h"
#include "engine/dist/comm.h"
}
#include "kernels/common.cuh"

typedef struct {
    ncclComm_t nc;
    cudaStream_t stream;
    int aborted; /* set by nccl_abort (read with __atomic) */
    const int *cancel; /* during comm_nccl_open only: the caller's cancel flag */
} nccl_impl;

#define IMPL(c) ((nccl_impl *)(c)->impl)

static int aborted(nccl_impl *x) { return __atomic_load_n(&x->aborted, __ATOMIC_ACQUIRE); }

static void nap(void) {
    struct timespec ts = {0, 20000}; /* 20 us: polling must not hold a core */
    nanosleep(&ts, NULL);
}

/* Waits until the communicator's last call settled; 0 or GE_COMM. */
static int settle(nccl_impl *x, ncclResult_t r, const char *what) {
    while (r == ncclInProgress && !aborted(x)) {
        if (x->cancel && __atomic_load_n(x->cancel, __ATOMIC_ACQUIRE)) { /* another rank will not come */
            __atomic_store_n(&x->aborted, 1, __ATOMIC_RELEASE);
            ncclCommAbort(x->nc);
            x->nc = NULL;
            return err_set(GE_COMM, "nccl: %s: cancelled (another rank failed to open)", what);
        }
        ncclResult_t a = ncclSuccess;
        ncclCommGetAsyncError(x->nc, &a);
        r = a;
        if (r == ncclInProgress) nap();
    }
    if (aborted(x)) return err_set(GE_COMM, "nccl: %s: the communicator was aborted", what);
    if (r != ncclSuccess) return err_set(GE_COMM, "nccl: %s: %s (%s)", what, ncclGetErrorString(r), ncclGetLastError(x->nc));
    return 0;
}

/* Waits for the op stream (the queued collective), watching for an abort or an async NCCL error. */
static int finish(nccl_impl *x, ncclResult_t r, const char *what) {
    int rc = settle(x, r, what);
    while (!rc) {
        cudaError_t e = cudaStreamQuery(x->stream);
        if (e == cudaSuccess) return 0;
        if (e != cudaErrorNotReady) return err_set(GE_COMM, "nccl: %s: the stream failed: %s", what, cudaGetErrorString(e));
        ncclResult_t a = ncclSuccess;
        ncclCommGetAsyncError(x->nc, &a);
        if (aborted(x)) return err_set(GE_COMM, "nccl: %s: the communicator was aborted", what);
        if (a != ncclSuccess && a != ncclInProgress)
            return err_set(GE_COMM, "nccl: %s: %s (%s)", what, ncclGetErrorString(a), ncclGetLastError(x->nc));
        nap();
    }
    return rc;
}

static ncclDataType_t sum_type(comm_type t) { return t == COMM_F32 ? ncclFloat32 : t == COMM_BF16 ? ncclBfloat16 : ncclInt32; }

static int nc_all_reduce(comm *c, void *buf, size_t n, comm_type t) {
    nccl_impl *x = IMPL(c);
    if (aborted(x)) return err_set(GE_COMM, "nccl: all-reduce: the communicator was aborted");
    return finish(x, ncclAllReduce(buf, buf, n, sum_type(t), ncclSum, x->nc, x->stream), "all-reduce");
}

static int nc_reduce_scatter(comm *c, const void *in, void *out, size_t n, comm_type t) {
    nccl_impl *x = IMPL(c);
    if (aborted(x)) return err_set(GE_COMM, "nccl: reduce-scatter: the communicator was aborted");
    return finish(x, ncclReduceScatter(in, out, n, sum_type(t), ncclSum, x->nc, x->stream), "reduce-scatter");
}

static int nc_all_gather(comm *c, const void *in, void *out, size_t n, comm_type t) {
    nccl_impl *x = IMPL(c);
    if (aborted(x)) return err_set(GE_COMM, "nccl: all-gather: the communicator was aborted");
    return finish(x, ncclAllGather(in, out, n * comm_type_bytes(t), ncclUint8, x->nc, x->stream), "all-gather");
}

static int nc_broadcast(comm *c, void *buf, size_t n, comm_type t, int root) {
    nccl_impl *x = IMPL(c);
    if (aborted(x)) return err_set(GE_COMM, "nccl: broadcast: the communicator was aborted");
    return finish(x, ncclBroadcast(buf, buf, n * comm_type_bytes(t), ncclUint8, root, x->nc, x->stream), "broadcast");
}

/* Grouped point-to-point: a send and a receive per peer with a part (bytes), one group, so NCCL
 * runs them together and no order of peers can deadlock; the rank's own part is a copy on the
 * stream. */
static int nc_all_to_all_v(comm *c, const void *in, const size_t *send, void *out, const size_t *recv, comm_type t) {
    nccl_impl *x = IMPL(c);
    if (aborted(x)) return err_set(GE_COMM, "nccl: all-to-all-v: the communicator was aborted");
    size_t eb = comm_type_bytes(t), so = 0, ro = 0;
    const char *src = (const char *)in;
    char *dst = (char *)out;
    ncclResult_t r = ncclGroupStart();
    for (int q = 0; q < c->size && (r == ncclSuccess || r == ncclInProgress); q++) {
        if (q == c->rank) {
            if (send[q] && cudaMemcpyAsync(dst + ro, src + so, send[q] * eb, cudaMemcpyDeviceToDevice, x->stream) != cudaSuccess)
                r = ncclUnhandledCudaError;
        } else {
            if (send[q]) r = ncclSend(src + so, send[q] * eb, ncclUint8, q, x->nc, x->stream);
            if (recv[q] && (r == ncclSuccess || r == ncclInProgress))
                r = ncclRecv(dst + ro, recv[q] * eb, ncclUint8, q, x->nc, x->stream);
        }
        so += send[q] * eb;
        ro += recv[q] * eb;
    }
    ncclResult_t e = ncclGroupEnd();
    if (r == ncclSuccess || r == ncclInProgress) r = e;
    return finish(x, r, "all-to-all-v");
}

/* NCCL has no barrier: an all-reduce of one int is one. */
static int nc_barrier(comm *c) {
    nccl_impl *x = IMPL(c);
    if (aborted(x)) return err_set(GE_COMM, "nccl: barrier: the communicator was aborted");
    int *d = NULL;
    if (cudaMallocAsync((void **)&d, sizeof(int), x->stream) != cudaSuccess) {
        cudaGetLastError();
        return err_set(GE_COMM, "nccl: barrier: cannot allocate 4 bytes");
    }
    cudaMemsetAsync(d, 0, sizeof(int), x->stream);
    int rc = finish(x, ncclAllReduce(d, d, 1, ncclInt32, ncclSum, x->nc, x->stream), "barrier");
    cudaFreeAsync(d, x->stream);
    return rc;
}

static void nc_abort(comm *c) {
    nccl_impl *x = IMPL(c);
    if (__atomic_exchange_n(&x->aborted, 1, __ATOMIC_ACQ_REL)) return;
    ncclCommAbort(x->nc); /* ends queued collectives; the handle is gone after this */
}

static void nc_free(comm *c) {
    nccl_impl *x = IMPL(c);
    if (!aborted(x)) {
        ncclResult_t r = ncclCommFinalize(x->nc);
        if (settle(x, r, "finalize") == 0) ncclCommDestroy(x->nc);
        else ncclCommAbort(x->nc);
    }
    free(x);
    free(c);
}

static const comm_ops nccl_ops = {nc_all_reduce,   nc_reduce_scatter, nc_all_gather, nc_broadcast,
                                  nc_all_to_all_v, nc_barrier,        nc_abort,      nc_free};

extern "C" int comm_nccl_unique_id(unsigned char id[128]) {
    static_assert(sizeof(ncclUniqueId) == 128, "ncclUniqueId is 128 bytes");
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess) return err_set(GE_COMM, "nccl: ncclGetUniqueId: %s", ncclGetErrorString(r));
    memcpy(id, &u, 128);
    return 0;
}

extern "C" int comm_nccl_open(const unsigned char id[128], int rank, int W, struct eng_backend *be, const int *cancel, comm **out) {
    *out = NULL;
    if (!be || strcmp(be->name, "cuda")) return err_set(GE_INVALID, "nccl: needs the cuda backend");
    if (W < 1 || rank < 0 || rank >= W) return err_set(GE_INVALID, "nccl: rank %d of %d", rank, W);
    comm *c = (comm *)calloc(1, sizeof *c);
    nccl_impl *x = (nccl_impl *)calloc(1, sizeof *x);
    if (!c || !x) {
        free(c);
        free(x);
        return err_set(GE_NOMEM, "nccl: out of memory");
    }
    x->stream = ((cu_ctx *)be->impl)->stream;
    x->cancel = cancel;
    /* NCCL takes the calling thread's current device: make it the backend's (a backend made on
     * another thread leaves this one on device 0, and two ranks on one device fail the set-up) */
    int dev = -1;
    if (cudaStreamGetDevice(x->stream, &dev) != cudaSuccess || cudaSetDevice(dev) != cudaSuccess) {
        free(x);
        free(c);
        return err_set(GE_COMM, "nccl: the backend's device: %s", cudaGetErrorString(cudaGetLastError()));
    }
    ncclUniqueId u;
    memcpy(&u, id, 128);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&x->nc, W, u, rank, &cfg);
    int rc = r == ncclSuccess || r == ncclInProgress ? settle(x, r, "ncclCommInitRankConfig")
                                                     : err_set(GE_COMM, "nccl: ncclCommInitRankConfig: %s", ncclGetErrorString(r));
    if (rc) {
        if (x->nc && !aborted(x)) ncclCommAbort(x->nc);
        free(x);
        free(c);
        return rc;
    }
    x->cancel = NULL; /* set-up only: a running collective ends by comm_abort */
    *c = (comm){&nccl_ops, rank, W, x};
    *out = c;
    return 0;
}
