/* test_hooks.h — kill points for the crash tests, compiled in only with -DGRPOD_TEST_HOOKS
 * (build/grpod-test-hooks, Makefile; never ./grpod, where test_hook_kill is empty).
 *
 * GRPOD_TEST_KILL_AT=POINT makes the process SIGKILL itself the first time it reaches POINT,
 * as a kill -9 landing exactly there would (tests/integration/torture.py). Points:
 *   checkpoint_renamed   a checkpoint job's directory is in place (renamed and fsynced, or kept),
 *                        before the store indexes it (daemon/jobs.c run_checkpoint)
 *   checkpoint_indexed   the store indexes it, before the job's done-write (daemon/worker.c)
 *
 * GRPOD_TEST_HOLD_AT=POINT with GRPOD_TEST_HOLD_FILE=PATH makes the thread that reaches POINT
 * wait until PATH exists (at most 120 s), so a test can see what runs meanwhile. Points:
 *   checkpoint_write     a checkpoint's writer thread, before it writes (daemon/jobs.c)
 *   stream_tokens        the worker, once a streamed rollout has a response of 4 tokens or
 *                        more, after handing them to the reply (daemon/worker.c)
 *   peer_stream_tokens   a peer rank's thread, once a streamed part of it has a response of 4
 *                        tokens or more, after copying them for rank 0 (daemon/ranks.c)
 *   follower_stream_tokens  a follower's main thread, once it posted 4 or more tokens of a part
 *                        the leader streams (daemon/follow.c; its sampling waits too)
 *   comm_down            the peer rank of GRPOD_TEST_COMM_DOWN_AT=update, before it takes the
 *                        communicator down (so a test can queue jobs behind the update first)
 *
 * GRPOD_TEST_COMM_DOWN_AT=POINT makes test_hook_once true the first time a thread reaches POINT,
 * for the caller to take the ranks' communicator down there, as a rank whose collective failed
 * would. Points:
 *   update               a peer rank, as it starts an update (daemon/jobs.c spmd_update) */
#ifndef GRPOD_TEST_HOOKS_H
#define GRPOD_TEST_HOOKS_H
#ifdef GRPOD_TEST_HOOKS
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"

static inline void test_hook_kill(const char *point) {
    const char *at = getenv("GRPOD_TEST_KILL_AT");
    if (!at || strcmp(at, point)) return;
    log_event(LOG_WARN, "test_kill", "\"at\":\"%s\"", point);
    raise(SIGKILL);
}

static inline void test_hook_hold(const char *point) {
    const char *at = getenv("GRPOD_TEST_HOLD_AT"), *file = getenv("GRPOD_TEST_HOLD_FILE");
    if (!at || !file || strcmp(at, point)) return;
    log_event(LOG_WARN, "test_hold", "\"at\":\"%s\"", point);
    for (int i = 0; i < 12000 && access(file, F_OK); i++) usleep(10000);
}

static inline int test_hook_once(const char *var, const char *point) {
    static int fired;
    const char *at = getenv(var);
    if (!at || strcmp(at, point) || __atomic_exchange_n(&fired, 1, __ATOMIC_ACQ_REL)) return 0;
    log_event(LOG_WARN, "test_once", "\"var\":\"%s\",\"at\":\"%s\"", var, point);
    return 1;
}
#else
static inline void test_hook_kill(const char *point) { (void)point; }
static inline void test_hook_hold(const char *point) { (void)point; }
static inline int test_hook_once(const char *var, const char *point) {
    (void)var;
    (void)point;
    return 0;
}
#endif
#endif
