/* backend_cuda_xfer.cu — the cuda backend's copy lanes and device-memory query (backend.h:
 * copy_async, mark, wait, mem_info, scratch_held): three copy streams beside the op stream and a fixed table of
 * events, so that host-resident state (engine/train/offload.c) moves while the GPU computes. Copies
 * use cudaMemcpyDefault (unified addressing tells the direction); host memory must be pinned
 * for them to be asynchronous. Only the engine thread calls these. */
extern "C" {
#include "engine/backend/backend.h"
#include "common/err.h"
}
#include "kernels/common.cuh"

typedef struct {
    cudaStream_t lane[BE_LANES]; /* [0] is the op stream (not owned) */
    cudaEvent_t ev[BE_EVENTS];
} cu_xfer;

#define CTX(b) ((cu_ctx *)(b)->impl)
#define XF(b) ((cu_xfer *)(b)->xfer)

static int lane_ok(int lane) { return lane >= 0 && lane < BE_LANES; }

static int xf_copy(eng_backend *b, int lane, void *dst, const void *src, size_t n) {
    cu_ctx *c = CTX(b);
    if (!c->failed && n && lane_ok(lane)) CU_CK(c, cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, XF(b)->lane[lane]));
    return c->failed ? err_set(GE_CUDA, "cuda backend failed: %s", c->msg) : 0;
}
static void xf_mark(eng_backend *b, int lane, int ev) {
    cu_ctx *c = CTX(b);
    if (!c->failed && lane_ok(lane) && ev >= 0 && ev < BE_EVENTS) CU_CK(c, cudaEventRecord(XF(b)->ev[ev], XF(b)->lane[lane]));
}
static int xf_wait(eng_backend *b, int lane, int ev) {
    cu_ctx *c = CTX(b);
    if (!c->failed && ev >= 0 && ev < BE_EVENTS) {
        if (lane == BE_LANE_HOST) CU_CK(c, cudaEventSynchronize(XF(b)->ev[ev]));
        else if (lane_ok(lane)) CU_CK(c, cudaStreamWaitEvent(XF(b)->lane[lane], XF(b)->ev[ev], 0));
    }
    return c->failed ? err_set(GE_CUDA, "cuda backend failed: %s", c->msg) : 0;
}
static int xf_mem_info(eng_backend *b, size_t *fr, size_t *tot) {
    *fr = *tot = 0;
    if (cudaMemGetInfo(fr, tot) != cudaSuccess) {
        cudaGetLastError();
        return err_set(GE_CUDA, "cudaMemGetInfo failed");
    }
    return 0;
}

static size_t xf_scratch_held(eng_backend *b) { return CTX(b)->scratch_bytes; }

/* Called by backend_cuda_create once the op stream exists; 0 or GE_CUDA. */
int cu_xfer_init(eng_backend *b) {
    cu_ctx *c = CTX(b);
    cu_xfer *x = (cu_xfer *)calloc(1, sizeof *x);
    if (!x) return err_set(GE_NOMEM, "cuda backend: out of host memory");
    b->xfer = x;
    x->lane[0] = c->stream;
    for (int i = 1; i < BE_LANES; i++) CU_CK(c, cudaStreamCreateWithFlags(&x->lane[i], cudaStreamNonBlocking));
    for (int i = 0; i < BE_EVENTS; i++) CU_CK(c, cudaEventCreateWithFlags(&x->ev[i], cudaEventDisableTiming));
    if (c->failed) return err_set(GE_CUDA, "cuda backend: %s", c->msg);
    b->copy_async = xf_copy;
    b->mark = xf_mark;
    b->wait = xf_wait;
    b->mem_info = xf_mem_info;
    b->scratch_held = xf_scratch_held;
    return 0;
}

void cu_xfer_free(eng_backend *b) {
    cu_xfer *x = XF(b);
    if (!x) return;
    for (int i = 1; i < BE_LANES; i++)
        if (x->lane[i]) {
            cudaStreamSynchronize(x->lane[i]);
            cudaStreamDestroy(x->lane[i]);
        }
    for (int i = 0; i < BE_EVENTS; i++)
        if (x->ev[i]) cudaEventDestroy(x->ev[i]);
    free(x);
    b->xfer = NULL;
}
