/* comm.c — the comm functions (comm.h): argument checks, then the implementation's table.
 * In a build without NCCL (CPU-only, or no nccl.h found) the NCCL entry points are here too and
 * say it is not built. */
#include "engine/dist/comm.h"

#include "common/err.h"

int comm_rank(const comm *c) { return c->rank; }
int comm_size(const comm *c) { return c->size; }

static int check_type(comm_type t, int sum) {
    if ((unsigned)t > COMM_U8 || (sum && t == COMM_U8))
        return err_set(GE_INVALID, "comm: type %d has no %s", (int)t, sum ? "sum" : "size");
    return 0;
}

int comm_all_reduce_sum(comm *c, void *buf, size_t n, comm_type t) {
    int rc = check_type(t, 1);
    return rc ? rc : c->ops->all_reduce_sum(c, buf, n, t);
}

int comm_reduce_scatter_sum(comm *c, const void *in, void *out, size_t n, comm_type t) {
    int rc = check_type(t, 1);
    return rc ? rc : c->ops->reduce_scatter_sum(c, in, out, n, t);
}

int comm_all_gather(comm *c, const void *in, void *out, size_t n, comm_type t) {
    int rc = check_type(t, 0);
    return rc ? rc : c->ops->all_gather(c, in, out, n, t);
}

int comm_broadcast(comm *c, void *buf, size_t n, comm_type t, int root) {
    int rc = check_type(t, 0);
    if (!rc && (root < 0 || root >= c->size)) rc = err_set(GE_INVALID, "comm: broadcast root %d of %d ranks", root, c->size);
    return rc ? rc : c->ops->broadcast(c, buf, n, t, root);
}

int comm_all_to_all_v(comm *c, const void *in, const size_t *send, void *out, const size_t *recv, comm_type t) {
    int rc = check_type(t, 0);
    return rc ? rc : c->ops->all_to_all_v(c, in, send, out, recv, t);
}

int comm_barrier(comm *c) { return c->ops->barrier(c); }
void comm_abort(comm *c) { c->ops->abort(c); }

void comm_free(comm *c) {
    if (c) c->ops->free(c);
}

#ifndef GRPOD_NCCL
int comm_nccl_unique_id(unsigned char id[128]) { return err_set(GE_UNSUPPORTED, "comm: this grpod was built without NCCL"); }
int comm_nccl_open(const unsigned char id[128], int rank, int W, struct eng_backend *be, const int *cancel, comm **out) {
    *out = NULL;
    return err_set(GE_UNSUPPORTED, "comm: this grpod was built without NCCL");
}
#endif
