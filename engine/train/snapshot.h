/* snapshot.h — the update's safety copy: what makes an update atomic.
 *
 * The state an optimizer step changes — the fp32 master of the trainable weights (the adapters
 * with LoRA), AdamW m and v (this rank's shard with a comm), opt_step and policy_version — is
 * copied before the update's first optimizer step and copied back when the update fails after
 * it, or when the caller takes a finished update back (eng_update_undo: the daemon's answer to
 * a failed done-write).
 *
 * The copy is started when the update starts (snap_begin) and runs beside the old, reference
 * and policy passes, which read the weights but do not change the state; snap_wait, before the
 * first optimizer step, waits for what is left of it. Where the copy lives is the memory plan's
 * choice (engine/plan.c), made once at open:
 *   SNAP_DEVICE  device memory: a device-to-device copy (milliseconds at 1.7B dims);
 *   SNAP_PINNED  pinned host memory: a copy on the backend's snapshot lane (BE_LANE_SNAP), fed
 *                a piece at a time by a helper thread, so the passes' own copies on the copy
 *                engines never wait behind more than one piece;
 *   SNAP_HOST    host memory, for host state (offload, or the cpu backend): memcpy, on a helper
 *                thread when the state is the cuda backend's offloaded state, else in snap_wait;
 *   SNAP_NONE    no room anywhere: no copy. The gradient norm is checked before the first step,
 *                so only a failure after a step (a non-finite step, a later mini-batch's
 *                failure, a backend error) or a take-back finds the state changed: those
 *                return GE_STATE_LOST, and the daemon stops and recovers by replay.
 * Only the engine thread calls these; while a copy is busy on a helper thread, that thread alone
 * uses the snapshot lane and the event BE_EV_SNAP. */
#ifndef GRPOD_SNAPSHOT_H
#define GRPOD_SNAPSHOT_H
#include <pthread.h>
#include <stddef.h>

enum { SNAP_NONE, SNAP_DEVICE, SNAP_PINNED, SNAP_HOST };

typedef struct {
    int where; /* SNAP_* */
    char *buf; /* master, m, v one after another (sz[0] + sz[1] + sz[2] bytes) */
    size_t sz[3]; /* bytes of each: n fp32, n moments (fp32, or bf16 with bf16 moments) */
    int busy; /* a copy was begun and not yet waited for */
    int thread; /* busy on the helper thread th (SNAP_HOST on cuda, SNAP_PINNED) */
    pthread_t th;
    const void *src[3]; /* what the helper thread copies */
    struct eng_backend *be; /* the helper thread's backend (SNAP_PINNED) */
    int rc; /* the helper thread's result (SNAP_PINNED) */
    int ok; /* buf holds the state before the last successful update */
    int opt_step;
    long long version;
    double ms_wait; /* the last snap_wait: time spent waiting for the copy */
} snap_state;

/* Names of the places, for the plan ("device", "pinned", "host", "none"). */
const char *snap_where_name(int where);
#endif
