/* worker.c — the engine thread; see worker.h.
 *
 * Scheduling: jobs are claimed in FIFO order. A rollout joins the continuous-batching
 * scheduler (eng_sched) and runs next to the rollouts claimed before it; the next job is
 * claimed while the scheduler can admit (no group waits for KV rows), so a burst of rollouts
 * shares every decode step. A logprobs job (read-only) runs between two steps. An update or
 * checkpoint claimed while rollouts are in flight is held — nothing behind it is claimed —
 * until they finish, then runs alone: a rollout's policy_version is the one it ran under. A
 * checkpoint's files are written on a thread of their own once the state is captured: rollouts
 * and logprobs behind it run meanwhile, an update or checkpoint is held until the write ends.
 *
 * Exactly once (docs/api.md "Crashes and replay"): at start the policy is the newest checkpoint
 * that verifies against its manifest, plus the done updates after it re-applied in the order
 * they were applied (replay); an update's completion and the version it made are committed in
 * one transaction, and when that commit fails the update is taken back (eng_update_undo) and
 * the job requeued — or, when even that cannot be written, the daemon stops taking work (503)
 * and the next start recovers by replay. */
#define _GNU_SOURCE /* sched_getaffinity */
#include "daemon/worker.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "api/metrics.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "daemon/history.h"
#include "daemon/jobs.h"
#include "daemon/cluster.h"
#include "daemon/ranks.h"
#include "daemon/test_hooks.h"
#include "store/store.h"

struct worker {
    worker_config cfg;
    char data_dir[1024], model_dir[1024], backend[16], lora_targets[128], lora_init[1024], optimizer_offload[16];
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int pending; /* wakes since the last claim attempt */
    _Atomic int stop, ready;
    _Atomic int finished; /* thread_main returned (or is about to) */
    _Atomic long long beat_ns, policy_version;
    eng *e; /* rank 0's engine */
    ranks *rk; /* every rank; ranks 1..W-1 on their own threads (ranks.h) */
    store *st;
    const char *cur_job; /* engine thread only */
    double last_progress_store;
    eng_sched *sched; /* rank 0's rollouts in flight (engine thread only) */
    struct flight *flights; /* their jobs, in claim order */
    store_job held; /* an update/checkpoint waiting for the rollouts (or a checkpoint's write) to finish */
    int have_held;
    long long kv_rows, state_rows; /* the pool's rows, for the API's size check */
    long long saved_version; /* policy version of the newest checkpoint */
    int halted; /* the store cannot be trusted: claim nothing (503) */
    int since_retain; /* outcomes stored since the last retention pass */
    struct writing *writing; /* a checkpoint whose files are being written (engine thread only) */
};

static void beat(worker *w) { atomic_store(&w->beat_ns, clock_mono_ns()); }

/* The stalest rank's: a peer wedged in a kernel stops the pings even while rank 0 waits for it. */
double worker_heartbeat_age(worker *w) {
    double age = (double)(clock_mono_ns() - atomic_load(&w->beat_ns)) * 1e-9;
    pthread_mutex_lock(&w->mu);
    double peers = w->rk ? ranks_heartbeat_age(w->rk) : 0;
    pthread_mutex_unlock(&w->mu);
    return peers > age ? peers : age;
}
int worker_ready(worker *w) { return atomic_load(&w->ready); }
long long worker_policy_version(worker *w) { return atomic_load(&w->policy_version); }

#ifdef GRPOD_TEST_HOOKS
/* Test hook, compiled only into build/grpod-test-hooks (Makefile; never ./grpod):
 * GRPOD_TEST_HANG_ENGINE_AFTER_MS=N makes this thread hang N ms after it starts, so the
 * watchdog pings must stop (tests/deploy/test_notify.py). */
static void maybe_hang(worker *w, long long t0) {
    static long long hang_ms = -2;
    if (hang_ms == -2) {
        const char *h = getenv("GRPOD_TEST_HANG_ENGINE_AFTER_MS");
        hang_ms = h && *h ? atoll(h) : -1;
    }
    if (hang_ms >= 0 && clock_mono_ns() - t0 >= hang_ms * 1000000LL) {
        log_event(LOG_WARN, "engine_test_hang", NULL);
        for (;;) sleep(1000);
    }
}
#else
static void maybe_hang(worker *w, long long t0) {
    (void)w;
    (void)t0;
}
#endif

static void on_progress(void *ud, double fraction) {
    worker *w = ud;
    beat(w);
    double now = clock_mono_s();
    if (w->cur_job && now - w->last_progress_store > 0.5) {
        w->last_progress_store = now;
        store_progress(w->st, w->cur_job, fraction);
    }
}

static void update_version(worker *w) {
    eng_info in;
    eng_get_info(w->e, &in);
    atomic_store(&w->policy_version, in.policy_version);
}

/* The newest indexed checkpoint whose files match its manifest, or "" (resume from the model):
 * a corrupt or incomplete one is skipped with a warning (replay covers what it held). */
static void latest_checkpoint(worker *w, char *out, size_t n, long long *version) {
    store_ckpt *cks = NULL;
    int nc = 0;
    char esc[700];
    out[0] = 0;
    *version = -1;
    if (store_checkpoint_list(w->st, &cks, &nc)) return;
    for (int i = 0; i < nc; i++) {
        if (eng_checkpoint_verify(cks[i].path) == 0) {
            snprintf(out, n, "%s", cks[i].path);
            *version = cks[i].policy_version;
            break;
        }
        log_event(LOG_WARN, "checkpoint_skipped", "\"id\":\"%s\",\"path\":\"%s\",\"message\":%s", cks[i].id, cks[i].path,
                  log_str(esc, sizeof esc, err_msg()));
    }
    free(cks);
}

/* --engine-threads 0: every core this process may run on, but one left to the client (the
 * training loop, reward code) and the HTTP threads on machines of more than 4 cores. On small
 * machines the passive waits (main.c) already give the client its turns, and one engine thread
 * fewer costs more than it leaves: on 2 shared cores the toy task took 36 s with one engine
 * thread and 16 s with two, and one busy neighbour slowed one thread 1.9x, two 1.03x
 * (docs/benchmarks.md, "Sharing the machine"). */
int worker_default_threads(void) {
    cpu_set_t set;
    int n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    return n > 4 ? n - 1 : n > 0 ? n : 1;
}

/* Removes DATA/checkpoints/\*.tmp: saves a crash (or a full disk) cut short. */
static void remove_temporaries(worker *w) {
    char dir[1100], p[1400];
    snprintf(dir, sizeof dir, "%s/checkpoints", w->data_dir);
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l < 5 || strcmp(de->d_name + l - 4, ".tmp")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        int rc = eng_remove_tree(p);
        log_event(rc ? LOG_WARN : LOG_INFO, "checkpoint_temporary_removed", "\"path\":\"%s\",\"ok\":%s", p, rc ? "false" : "true");
    }
    closedir(d);
}

/* Re-applies the done updates the resumed checkpoint lacks, in their original order, from their
 * stored inputs; the store is only read. /readyz says how far it got. */
static int replay(worker *w) {
    store_job *js = NULL;
    int n = 0, rc;
    long long v = atomic_load(&w->policy_version);
    if ((rc = store_updates_after(w->st, v, &js, &n))) return rc;
    if (n) log_event(LOG_INFO, "replay_start", "\"from_version\":%lld,\"updates\":%d", v, n);
    double t0 = (double)clock_mono_ns();
    metrics_replay(0, n);
    for (int i = 0; i < n && !rc && !atomic_load(&w->stop); i++) {
        char why[200], *res = NULL;
        snprintf(why, sizeof why, "replaying completed updates after a restart: %d of %d done (policy_version %lld)", i, n,
                 (long long)atomic_load(&w->policy_version));
        api_set_loading(w->cfg.api, why);
        err_clear();
        if (!strcmp(js[i].payload, "{}")) /* prune_inputs: both checkpoints that covered it are unusable */
            rc = err_set(GE_INTERNAL,
                         "its inputs were dropped when two checkpoints covered version %lld, and "
                         "neither can be resumed now",
                         js[i].policy_version);
        else rc = jobs_run(&(jobs_env){w->e, w->rk, w->st, w->data_dir, on_progress, w}, &js[i], &res);
        free(res);
        update_version(w);
        if (rc) {
            char esc[700];
            log_event(LOG_ERROR, "replay_failed", "\"id\":\"%s\",\"code\":\"%s\",\"message\":%s", js[i].id, err_name(rc),
                      log_str(esc, sizeof esc, err_msg()));
            rc = err_set(rc, "replaying update %s failed: %s", js[i].id, err_msg());
            break;
        }
        if (atomic_load(&w->policy_version) != js[i].policy_version)
            log_event(LOG_WARN, "replay_version_mismatch", "\"id\":\"%s\",\"stored\":%lld,\"replayed\":%lld", js[i].id,
                      js[i].policy_version, (long long)atomic_load(&w->policy_version));
        metrics_replay(i + 1, n);
        log_event(LOG_INFO, "replay_progress", "\"id\":\"%s\",\"done\":%d,\"of\":%d,\"policy_version\":%lld", js[i].id, i + 1, n,
                  (long long)atomic_load(&w->policy_version));
    }
    if (n && !rc)
        log_event(LOG_INFO, "replay_done", "\"updates\":%d,\"policy_version\":%lld,\"ms\":%.0f", n,
                  (long long)atomic_load(&w->policy_version), ((double)clock_mono_ns() - t0) / 1e6);
    store_jobs_free(js, n);
    return rc;
}

static void on_rank_event(void *ud) { worker_wake(ud); }

/* Opens every rank's engine (the peers on their threads, rank 0 here, at the same time: a
 * communicator's set-up is collective) and rank 0's scheduler, then replays. Each rank gets
 * an equal share of the engine threads, so the ranks compute alike; ranks_start makes the
 * communicator, and rank 0 takes its end of it (ranks_open_rank0). */
static int open_engine(worker *w) {
    char model[1200], resume[600];
    int rc, W = w->cfg.ranks > 1 ? w->cfg.ranks : 1;
    if (w->model_dir[0]) {
        snprintf(model, sizeof model, "%s", w->model_dir);
    } else {
        snprintf(model, sizeof model, "%s/default-model", w->data_dir);
        if ((rc = eng_ensure_default_model(model))) return rc;
    }
    remove_temporaries(w);
    latest_checkpoint(w, resume, sizeof resume, &w->saved_version);
    int threads = w->cfg.n_threads > 0 ? w->cfg.n_threads : worker_default_threads();
    eng_open_opts o = {.model_dir = model,
                       .backend = w->backend,
                       .resume_dir = resume[0] ? resume : NULL,
                       .n_threads = threads / W > 0 ? threads / W : 1,
                       .lora_rank = w->cfg.lora_rank,
                       .lora_alpha = w->cfg.lora_alpha,
                       .lora_targets = w->lora_targets,
                       .lora_init = w->lora_init,
                       .optimizer_offload = w->optimizer_offload,
                       .optimizer_moments = w->cfg.moments_bf16 ? "bf16" : NULL,
                       .expert_parallel = w->cfg.expert_parallel};
    eng_sched_opts so = {.kv_bytes = w->cfg.kv_budget_mib << 20};
    log_event(LOG_INFO, "engine_opening", "\"model\":\"%s\",\"backend\":\"%s\",\"resume\":\"%s\",\"threads\":%d,\"ranks\":%d",
              model, w->backend, resume, o.n_threads, W);
    double t0 = (double)clock_mono_ns();
    ranks *rk;
    ranks_world wd, *world = NULL;
    if (w->cfg.cluster) { /* the followers' ranks join ours: one communicator for the world */
        if ((rc = cluster_form(w->cfg.cluster, W, eng_backend_resolve(w->backend), resume[0] ? resume : NULL,
                               w->cfg.expert_parallel, &w->stop, &wd)))
            return rc;
        world = &wd;
    }
    if ((rc = ranks_start(W, &o, w->cfg.devices, &so, on_rank_event, w, world, &rk))) return rc;
    if (w->cfg.cluster) cluster_attach(w->cfg.cluster, rk);
    pthread_mutex_lock(&w->mu);
    w->rk = rk;
    pthread_mutex_unlock(&w->mu);
    if ((rc = ranks_open_rank0(w->rk, &o, &w->e))) return rc;
    if ((rc = eng_sched_open(w->e, &so, &w->sched))) return rc;
    ranks_set_rank0(w->rk, w->e, w->sched);
    update_version(w);
    if (w->saved_version < 0) w->saved_version = atomic_load(&w->policy_version);
    if ((rc = replay(w))) return rc;
    log_event(LOG_INFO, "engine_ready", "\"ms\":%.0f,\"policy_version\":%lld,\"ranks\":%d,\"comm\":\"%s\"",
              ((double)clock_mono_ns() - t0) / 1e6, (long long)atomic_load(&w->policy_version), W, ranks_comm_name(w->rk));
    return 0;
}

static void job_changed(worker *w) {
    api_jobs_changed(w->cfg.api);
    if (w->cfg.notify) w->cfg.notify(w->cfg.ud);
}

/* Stops taking work: /readyz 503 with why; the next start recovers (replay). */
static void halt(worker *w, const char *why) {
    char esc[700];
    w->halted = 1;
    log_event(LOG_ERROR, "halted", "\"message\":%s", log_str(esc, sizeof esc, why));
    api_set_failed(w->cfg.api, why);
}

/* An update's done-write failed: the store does not know the weights. Take the update back;
 * requeue the job (it runs again, once) or, when that cannot be written either, halt. */
static void finish_failed(worker *w, const store_job *j) {
    char why[900], esc[700];
    int conflict = err_code() == GE_CONFLICT;
    snprintf(why, sizeof why, "%s", err_msg());
    int urc = jobs_update_undo(&(jobs_env){w->e, w->rk, w->st, w->data_dir, on_progress, w});
    update_version(w);
    log_event(LOG_ERROR, "update_taken_back", "\"id\":\"%s\",\"policy_version\":%lld,\"ok\":%s,\"message\":%s", j->id,
              (long long)atomic_load(&w->policy_version), urc ? "false" : "true", log_str(esc, sizeof esc, why));
    char msg[1200];
    if (urc || conflict || store_requeue(w->st, j->id)) {
        snprintf(msg, sizeof msg, "update %s: its completion could not be stored (%s); restart grpod to recover", j->id, why);
        halt(w, msg);
    } else {
        log_event(LOG_INFO, "job_requeued", "\"id\":\"%s\"", j->id);
    }
}

/* Deletes finished jobs past --retain-jobs (store_retain): every RETAIN_EVERY stored outcomes,
 * and at once (now) at start and after a checkpoint, whose pruned inputs free older updates. */
#define RETAIN_EVERY 256
static void retain(worker *w, int now) {
    if (w->cfg.retain_jobs <= 0 || (!now && ++w->since_retain < RETAIN_EVERY)) return;
    w->since_retain = 0;
    int n = store_retain(w->st, w->cfg.retain_jobs);
    char esc[700];
    if (n < 0) log_event(LOG_WARN, "jobs_retain_failed", "\"message\":%s", log_str(esc, sizeof esc, err_msg()));
    else if (n > 0)
        log_event(LOG_INFO, "jobs_deleted", "\"count\":%d,\"retain_jobs\":%lld,\"store_mib\":%lld", n, w->cfg.retain_jobs,
                  store_size_bytes(w->st) >> 20);
}

/* Stores how job j ended: rc 0 with result, or the error err_msg() holds. v0: the policy
 * version before it ran. */
static void store_outcome(worker *w, const store_job *j, int rc, const char *result, double ms, long long v0) {
    char esc[700];
    int src;
    retain(w, 0);
    if (rc == 0 && !strcmp(j->kind, "update")) {
        src = store_finish_update(w->st, j->id, result, v0, atomic_load(&w->policy_version));
        if (src) {
            log_event(LOG_ERROR, "store_write_failed", "\"id\":\"%s\",\"message\":%s", j->id, log_str(esc, sizeof esc, err_msg()));
            finish_failed(w, j);
            return;
        }
        log_event(LOG_INFO, "job_done", "\"id\":\"%s\",\"kind\":\"%s\",\"ms\":%.1f,\"policy_version\":%lld", j->id, j->kind, ms,
                  (long long)atomic_load(&w->policy_version));
        history_record(w->st, j->kind, result, atomic_load(&w->policy_version));
        return;
    }
    if (rc == 0) {
        src = store_finish(w->st, j->id, result, atomic_load(&w->policy_version));
        log_event(LOG_INFO, "job_done", "\"id\":\"%s\",\"kind\":\"%s\",\"ms\":%.1f", j->id, j->kind, ms);
        /* after the log line: a crash between the two loses a history row, not the job's record */
        if (!src) history_record(w->st, j->kind, result, atomic_load(&w->policy_version));
    } else {
        json_object *e = json_object_new_object();
        json_object_object_add(e, "code", json_object_new_string(err_name(rc)));
        json_object_object_add(e, "message", json_object_new_string(err_msg()[0] ? err_msg() : err_default(rc)));
        src = store_fail(w->st, j->id, json_object_to_json_string_ext(e, JSON_C_TO_STRING_PLAIN));
        json_object_put(e);
        log_event(LOG_WARN, "job_failed", "\"id\":\"%s\",\"kind\":\"%s\",\"code\":\"%s\",\"message\":%s", j->id, j->kind,
                  err_name(rc), log_str(esc, sizeof esc, err_msg()));
        if (rc == GE_CUDA) api_set_failed(w->cfg.api, err_msg());
    }
    if (src)
        log_event(LOG_ERROR, "store_write_failed", "\"id\":\"%s\",\"message\":%s", j->id, log_str(esc, sizeof esc, err_msg()));
}

/* Drops the stored inputs of done updates that two checkpoints cover: a start resumes from the
 * newest checkpoint that verifies — the one before it when the newest is damaged — so replay
 * never reads an update at or below the second newest's version (docs/api.md). */
static void prune_inputs(worker *w) {
    store_ckpt *cks = NULL;
    int nc = 0;
    char esc[700];
    if (store_checkpoint_list(w->st, &cks, &nc)) return;
    if (nc >= 2) {
        int r = store_prune_inputs(w->st, cks[1].policy_version);
        if (r > 0) log_event(LOG_INFO, "inputs_pruned", "\"updates\":%d,\"up_to_version\":%lld", r, cks[1].policy_version);
        if (r < 0) log_event(LOG_WARN, "inputs_prune_failed", "\"message\":%s", log_str(esc, sizeof esc, err_msg()));
    }
    free(cks);
}

/* After a checkpoint job: the version is saved (no exit checkpoint for it), and with
 * --keep-checkpoints N the oldest beyond the newest N go (replay never needs them: the inputs of
 * every update the two newest do not both cover stay in the store); then prune_inputs. */
static void checkpoint_saved(worker *w) {
    update_version(w);
    w->saved_version = atomic_load(&w->policy_version);
    if (w->cfg.keep_checkpoints <= 0) {
        prune_inputs(w);
        retain(w, 1);
        return;
    }
    store_ckpt *cks = NULL;
    int nc = 0;
    if (store_checkpoint_list(w->st, &cks, &nc)) return;
    for (int i = (int)w->cfg.keep_checkpoints; i < nc; i++) {
        int rc = store_checkpoint_delete(w->st, cks[i].id);
        if (!rc) rc = eng_remove_tree(cks[i].path);
        log_event(rc ? LOG_WARN : LOG_INFO, "checkpoint_pruned", "\"id\":\"%s\",\"ok\":%s", cks[i].id, rc ? "false" : "true");
    }
    free(cks);
    prune_inputs(w);
    retain(w, 1);
}

/* How job j ended (rc, and result when 0), stored: cancelled when a DELETE flagged it (never an
 * update), else done or failed; a done checkpoint is the saved version. v0: the policy version
 * before it ran. */
static void job_ended(worker *w, const store_job *j, int rc, const char *result, double ms, long long v0) {
    char esc[700], lost[600] = "";
    if (rc) snprintf(lost, sizeof lost, "%s", err_msg()); /* before the store's calls */
    int cancelled = strcmp(j->kind, "update") && store_cancel_requested(w->st, j->id) == 1;
    if (cancelled) {
        if (store_mark_cancelled(w->st, j->id))
            log_event(LOG_ERROR, "store_write_failed", "\"id\":\"%s\",\"message\":%s", j->id, log_str(esc, sizeof esc, err_msg()));
        log_event(LOG_INFO, "job_cancelled", "\"id\":\"%s\"", j->id);
    } else {
        if (rc == 0 && !strcmp(j->kind, "checkpoint")) test_hook_kill("checkpoint_indexed");
        store_outcome(w, j, rc, result, ms, v0);
        if (rc == 0 && !strcmp(j->kind, "checkpoint")) checkpoint_saved(w);
    }
    /* a follower was lost (daemon/cluster.h): the ranks' states may differ; or a failed update
     * changed the state with no safety copy to restore (engine/train/snapshot.h): no more work
     * until the restart (replay makes the policy whole again) */
    if ((rc == GE_RANK_LOST || rc == GE_STATE_LOST) && !w->halted) halt(w, lost);
    /* the ranks' communicator is down (GE_COMM: aborted for good, engine/dist/comm.h), or the
     * ranks came back unlike each other (ranks.h ranks_diverged): no update, and under expert
     * parallelism no rollout (its decode copy is gathered by every update), can run again */
    if (rc && (rc == GE_COMM || (w->rk && ranks_diverged(w->rk))) && !w->halted) {
        char why[900];
        snprintf(why, sizeof why,
                 "job %s: %s (%s): the ranks must restart together; restart grpod (queued jobs wait for it, replay "
                 "recovers the policy)",
                 j->id, rc == GE_COMM ? "the ranks' communicator is down" : "the ranks disagree", lost);
        halt(w, why);
    }
    job_changed(w);
}

static void publish_sched(worker *w);

static void run_one(worker *w, store_job *j) {
    char *result = NULL;
    double t0 = (double)clock_mono_ns();
    w->cur_job = j->id;
    w->last_progress_store = 0;
    log_event(LOG_INFO, "job_start", "\"id\":\"%s\",\"kind\":\"%s\",\"attempt\":%d", j->id, j->kind, j->attempts);
    err_clear();
    long long v0 = atomic_load(&w->policy_version);
    int rc = jobs_run(&(jobs_env){w->e, w->rk, w->st, w->data_dir, on_progress, w}, j, &result);
    w->cur_job = NULL;
    beat(w);
    update_version(w);
    publish_sched(w); /* before the job reads as ended: an update emptied the prefix cache */
    job_ended(w, j, rc, result, ((double)clock_mono_ns() - t0) / 1e6, v0);
    free(result);
}

/* ---------------------------------------------------------------- rollouts in flight */

typedef struct flight {
    store_job job;
    jobs_rollout *r;
    double t0, next_progress, next_cancel_check;
    struct flight *next;
} flight;

/* The schedulers' gauges: each rank's, and their sums (jobs: the rollout jobs in flight). */
static void publish_sched(worker *w) {
    eng_sched_stats st[RANKS_MAX];
    metrics_sched_gauges per[RANKS_MAX], all = {0};
    int W = ranks_stats(w->rk, st, RANKS_MAX);
    for (int r = 0; r < W; r++) {
        per[r] = (metrics_sched_gauges){.jobs = st[r].jobs,
                                        .running_groups = st[r].running_groups,
                                        .running_responses = st[r].running_responses,
                                        .waiting_groups = st[r].waiting_groups,
                                        .kv_rows_used = st[r].rows_used,
                                        .kv_rows_capacity = st[r].rows_cap,
                                        .kv_row_bytes = st[r].row_bytes,
                                        .state_rows_used = st[r].state_rows_used,
                                        .state_rows_capacity = st[r].state_rows_cap,
                                        .state_row_bytes = st[r].state_row_bytes,
                                        .steps = st[r].steps,
                                        .prefix_entries = st[r].prefix_entries,
                                        .prefix_query_tokens = st[r].prefix_query_tokens,
                                        .prefix_hit_tokens = st[r].prefix_hit_tokens};
        all.running_groups += per[r].running_groups;
        all.prefix_entries += per[r].prefix_entries;
        all.prefix_query_tokens += per[r].prefix_query_tokens;
        all.prefix_hit_tokens += per[r].prefix_hit_tokens;
        all.running_responses += per[r].running_responses;
        all.waiting_groups += per[r].waiting_groups;
        all.kv_rows_used += per[r].kv_rows_used;
        all.kv_rows_capacity += per[r].kv_rows_capacity;
        all.state_rows_used += per[r].state_rows_used;
        all.state_rows_capacity += per[r].state_rows_capacity;
        all.steps += per[r].steps;
    }
    all.jobs = W > 1 ? 0 : per[0].jobs;
    for (flight *f = W > 1 ? w->flights : NULL; f; f = f->next) all.jobs++;
    all.kv_row_bytes = per[0].kv_row_bytes;
    all.state_row_bytes = per[0].state_row_bytes;
    metrics_sched(&all);
    metrics_ranks(per, W);
}

/* A claimed rollout joins the scheduler (or fails at once: a group that can never fit). */
static void flight_start(worker *w, store_job *j) {
    log_event(LOG_INFO, "job_start", "\"id\":\"%s\",\"kind\":\"%s\",\"attempt\":%d", j->id, j->kind, j->attempts);
    err_clear();
    flight *f = calloc(1, sizeof *f);
    int rc = f ? jobs_rollout_start(&(jobs_env){w->e, w->rk, w->st, w->data_dir, on_progress, w}, j, &f->r)
               : err_set(GE_NOMEM, "worker: out of memory");
    if (rc) {
        store_outcome(w, j, rc, NULL, 0, -1);
        store_job_clear(j);
        free(f);
        job_changed(w);
        return;
    }
    f->job = *j; /* takes over the payload */
    memset(j, 0, sizeof *j);
    f->t0 = clock_mono_s();
    flight **pp = &w->flights;
    while (*pp) pp = &(*pp)->next;
    *pp = f;
    publish_sched(w);
}

/* A streaming reply's tokens (api/tap.c): what rank 0 sampled so far, after each step. */
typedef struct {
    api_server *api;
    const char *id;
    int most; /* the longest response's tokens */
} tap_ctx;
static void tap_put(void *ud, int group, int resp, const eng_response *x, int k) {
    tap_ctx *t = ud;
    api_tokens a = {x->tokens, x->logprobs, k ? x->top_ids : NULL, k ? x->top_lps : NULL, x->n_tokens, k};
    api_tap_put(t->api, t->id, group, resp, &a);
    if (x->n_tokens > t->most) t->most = x->n_tokens;
}

/* Polls every rollout in flight: stores finished ones and progress, drops cancelled ones. */
static void flights_poll(worker *w) {
    double now = clock_mono_s();
    int changed = 0;
    for (flight **pp = &w->flights; *pp;) {
        flight *f = *pp;
        char *result = NULL;
        double progress;
        int started;
        err_clear();
        int st = jobs_rollout_poll(f->r, &progress, &started, &result);
        if (st == 1 && jobs_rollout_keep_routes(f->r, w->st, f->job.id)) st = GE_STORE; /* before the result: replay finds them */
        int cancel = 0;
        if (st == 0 && now >= f->next_cancel_check) {
            f->next_cancel_check = now + 0.2;
            cancel = store_cancel_requested(w->st, f->job.id) == 1;
        }
        if (st == 0 && !cancel) {
            if (api_tap_wanted(w->cfg.api, f->job.id)) {
                tap_ctx t = {w->cfg.api, f->job.id, 0};
                jobs_rollout_peek(f->r, tap_put, &t);
                api_tap_wake(w->cfg.api, f->job.id);
                if (t.most >= 4) test_hook_hold("stream_tokens");
            }
            if (now >= f->next_progress) {
                f->next_progress = now + 0.5;
                store_progress(w->st, f->job.id, progress);
            }
            pp = &f->next;
            continue;
        }
        if (cancel) {
            if (store_mark_cancelled(w->st, f->job.id)) log_event(LOG_ERROR, "store_write_failed", "\"id\":\"%s\"", f->job.id);
            log_event(LOG_INFO, "job_cancelled", "\"id\":\"%s\"", f->job.id);
        } else {
            store_outcome(w, &f->job, st == 1 ? 0 : st, result, (now - f->t0) * 1e3, -1);
        }
        free(result);
        jobs_rollout_free(f->r); /* a cancelled one stops here: its rows are freed */
        store_job_clear(&f->job);
        *pp = f->next;
        free(f);
        changed = 1;
    }
    if (changed) {
        publish_sched(w);
        job_changed(w);
    }
}

/* SIGTERM: rollouts none of whose groups started go back to the queue, as does a held job;
 * the others finish. */
static void requeue_unstarted(worker *w) {
    for (flight **pp = &w->flights; *pp;) {
        flight *f = *pp;
        double progress;
        int started = 1;
        char *result = NULL;
        if (jobs_rollout_poll(f->r, &progress, &started, &result) == 0 && !started) {
            jobs_rollout_free(f->r);
            if (store_requeue(w->st, f->job.id)) log_event(LOG_ERROR, "store_write_failed", "\"id\":\"%s\"", f->job.id);
            log_event(LOG_INFO, "job_requeued", "\"id\":\"%s\"", f->job.id);
            store_job_clear(&f->job);
            *pp = f->next;
            free(f);
            continue;
        }
        free(result);
        pp = &f->next;
    }
    if (w->have_held) {
        if (store_requeue(w->st, w->held.id)) log_event(LOG_ERROR, "store_write_failed", "\"id\":\"%s\"", w->held.id);
        log_event(LOG_INFO, "job_requeued", "\"id\":\"%s\"", w->held.id);
        store_job_clear(&w->held);
        w->have_held = 0;
    }
    publish_sched(w);
}

/* ---------------------------------------------------------------- a checkpoint being written */

typedef struct writing {
    store_job job;
    jobs_ckpt *c;
    double t0;
    long long v0;
} writing;

static void wake_cb(void *ud) { worker_wake(ud); }

/* A claimed checkpoint: the state captured now, its files written beside what follows. */
static void ckpt_start(worker *w, store_job *j) {
    log_event(LOG_INFO, "job_start", "\"id\":\"%s\",\"kind\":\"%s\",\"attempt\":%d", j->id, j->kind, j->attempts);
    err_clear();
    double t0 = clock_mono_ms();
    long long v0 = atomic_load(&w->policy_version);
    writing *wr = calloc(1, sizeof *wr);
    jobs_ckpt *c = NULL;
    w->cur_job = j->id;
    int rc = wr ? jobs_checkpoint_start(&(jobs_env){w->e, w->rk, w->st, w->data_dir, on_progress, w}, j, wake_cb, w, &c)
                : err_set(GE_NOMEM, "worker: out of memory");
    w->cur_job = NULL;
    beat(w);
    if (rc) {
        job_ended(w, j, rc, NULL, clock_mono_ms() - t0, v0);
        store_job_clear(j);
        free(wr);
        return;
    }
    wr->job = *j; /* takes over the payload */
    memset(j, 0, sizeof *j);
    wr->c = c;
    wr->t0 = t0;
    wr->v0 = v0;
    w->writing = wr;
}

/* The write's end: the job's outcome stored, updates may run again. */
static void ckpt_poll(worker *w) {
    writing *wr = w->writing;
    char *result = NULL;
    err_clear();
    int rc = jobs_checkpoint_poll(&(jobs_env){w->e, w->rk, w->st, w->data_dir, on_progress, w}, wr->c, &result);
    if (rc == 0) return;
    w->writing = NULL;
    job_ended(w, &wr->job, rc == 1 ? 0 : rc, result, clock_mono_ms() - wr->t0, wr->v0);
    free(result);
    jobs_checkpoint_free(wr->c);
    store_job_clear(&wr->job);
    free(wr);
}

/* Nothing runs beside an update or a checkpoint's capture: no rollout in flight, no write. */
static int engine_quiet(worker *w) { return !ranks_busy(w->rk) && !w->writing; }

/* Claims jobs while the scheduler can take more: rollouts join it, logprobs run now, an
 * update/checkpoint runs now when nothing is in flight, else is held (nothing behind it is
 * claimed). Returns 1 when it claimed something. */
static int claim_more(worker *w) {
    int did = 0;
    while (!w->have_held && !w->halted && ranks_can_admit(w->rk) && !atomic_load(&w->stop)) {
        store_job j = {0};
        int got = store_claim(w->st, &j);
        if (got < 0) log_event(LOG_ERROR, "store_claim_failed", "\"code\":\"%s\"", err_name(got));
        if (got != 1) break;
        did = 1;
        if (!strcmp(j.kind, "rollout")) {
            flight_start(w, &j);
        } else if (!strcmp(j.kind, "checkpoint") && engine_quiet(w)) {
            ckpt_start(w, &j);
        } else if (!strcmp(j.kind, "logprobs") || engine_quiet(w)) {
            run_one(w, &j);
            store_job_clear(&j);
        } else {
            w->held = j;
            w->have_held = 1;
            log_event(LOG_INFO, "job_held", "\"id\":\"%s\",\"kind\":\"%s\"", j.id, j.kind);
        }
    }
    return did;
}

static void save_on_exit(worker *w) {
    long long v = atomic_load(&w->policy_version);
    if (!w->cfg.checkpoint_on_exit || atomic_load(&w->ready) != 1 || w->halted || v == w->saved_version) return;
    store_job j = {0};
    snprintf(j.id, sizeof j.id, "exit-%lld", (long long)time(NULL));
    snprintf(j.kind, sizeof j.kind, "checkpoint");
    j.payload = "{}";
    char *res = NULL;
    if (jobs_run(&(jobs_env){w->e, w->rk, w->st, w->data_dir, on_progress, w}, &j, &res))
        log_event(LOG_ERROR, "checkpoint_on_exit_failed", "\"code\":\"%s\"", err_name(err_code()));
    free(res);
}

/* What checkpoints need on the data directory's disk: one is the policy in fp32 and the AdamW
 * moments (12 bytes a trainable parameter; the adapters only with LoRA), written whole beside
 * the ones kept until it is renamed into place. Logged at start; a daemon told to checkpoint at
 * exit on a disk that cannot hold one checkpoint is refused now, not at its shutdown. */
static int disk_plan(worker *w, const eng_info *in) {
    long long ckpt = 12 * (in->lora_rank ? in->lora_params : in->n_params);
    struct statvfs sv;
    long long avail = statvfs(w->data_dir, &sv) ? -1 : (long long)sv.f_bavail * (long long)sv.f_frsize;
    log_event(LOG_INFO, "disk_plan",
              "\"checkpoint_mib\":%lld,\"available_mib\":%lld,\"keep_checkpoints\":%lld,"
              "\"checkpoint_on_exit\":%s",
              ckpt >> 20, avail < 0 ? -1 : avail >> 20, (long long)w->cfg.keep_checkpoints,
              w->cfg.checkpoint_on_exit ? "true" : "false");
    if (w->cfg.checkpoint_on_exit && avail >= 0 && avail < ckpt)
        return err_set(GE_IO,
                       "a checkpoint of this model needs about %lld MiB on %s's disk and %lld MiB are free: free space, "
                       "move --data-dir, or pass --checkpoint-on-exit=false (and checkpoint where there is room)",
                       ckpt >> 20, w->data_dir, avail >> 20);
    return 0;
}

static void *thread_main(void *arg) {
    worker *w = arg;
    long long t0 = clock_mono_ns();
    beat(w);
    int rc = store_open(w->data_dir, 0, &w->st);
    if (!rc) rc = open_engine(w);
    if (!rc) {
        eng_sched_stats st;
        eng_sched_get_stats(w->sched, &st);
        w->kv_rows = st.rows_cap;
        w->state_rows = st.state_rows_cap;
        publish_sched(w);
        log_event(LOG_INFO, "kv_pool", "\"rows\":%lld,\"mib\":%.1f,\"state_rows\":%lld,\"state_mib\":%.1f,\"ranks\":%d",
                  st.rows_cap, st.rows_cap * (double)st.row_bytes / 1048576.0, st.state_rows_cap,
                  st.state_rows_cap * (double)st.state_row_bytes / 1048576.0, ranks_size(w->rk));
        eng_info in;
        eng_get_info(w->e, &in);
        const eng_plan *p = &in.plan;
        log_event(LOG_INFO, "memory_plan",
                  "\"device_mib\":%lld,\"weights_mib\":%lld,\"reference_mib\":%lld,\"master_mib\":%lld,\"gradients_mib\":%lld,"
                  "\"moments_mib\":%lld,\"host_state_mib\":%lld,\"optimizer\":\"%s\",\"snapshot\":\"%s\",\"snapshot_mib\":%lld,"
                  "\"kv_budget_mib\":%lld,\"activations_mib\":%lld,\"micro_batch_tokens\":%lld,\"micro_batch_tokens_limit\":%lld,"
                  "\"load_ms\":%.0f,\"plan_ms\":%.0f",
                  p->device_total >> 20, p->weights >> 20, p->reference >> 20, p->master >> 20, p->gradients >> 20,
                  p->moments >> 20, p->host_state >> 20, p->optimizer, p->snapshot_at, p->snapshot >> 20, p->kv_bytes >> 20,
                  p->acts_bytes >> 20, p->micro_batch_tokens, p->micro_batch_tokens_max, p->ms_load, p->ms_plan);
        rc = disk_plan(w, &in);
    }
    if (rc) {
        char esc[700];
        log_event(LOG_ERROR, "engine_failed", "\"code\":\"%s\",\"message\":%s", err_name(rc), log_str(esc, sizeof esc, err_msg()));
        api_set_failed(w->cfg.api, err_msg()[0] ? err_msg() : err_default(rc));
        atomic_store(&w->ready, -1);
    } else {
        retain(w, 1);
        api_set_kv_rows(w->cfg.api, w->kv_rows, w->state_rows);
        api_set_engine(w->cfg.api, w->e);
        atomic_store(&w->ready, 1);
    }
    if (w->cfg.notify) w->cfg.notify(w->cfg.ud);
    int draining = 0;
    for (;;) {
        beat(w);
        maybe_hang(w, t0);
        if (atomic_load(&w->stop) && !draining) {
            draining = 1;
            if (w->sched) requeue_unstarted(w);
        }
        if (w->writing) ckpt_poll(w);
        if (draining && !w->flights && !w->writing) break;
        if (atomic_load(&w->ready) == 1 && !w->halted && store_check_file(w->st)) halt(w, err_msg());
        if (atomic_load(&w->ready) == 1) {
            int did = claim_more(w);
            if (w->have_held && engine_quiet(w)) {
                if (store_mark_started(w->st, w->held.id))
                    log_event(LOG_ERROR, "store_write_failed", "\"id\":\"%s\"", w->held.id);
                w->have_held = 0;
                if (!strcmp(w->held.kind, "checkpoint")) ckpt_start(w, &w->held);
                else run_one(w, &w->held);
                store_job_clear(&w->held);
                continue;
            }
            if (eng_sched_busy(w->sched)) {
                ranks_step(w->rk);
                beat(w);
                publish_sched(w);
            } else if (w->flights) {
                publish_sched(w); /* the peers' steps */
            }
            if (w->flights) flights_poll(w);
            /* peers wake this thread (on_rank_event) when a part ends */
            if (did || eng_sched_busy(w->sched)) continue;
        }
        pthread_mutex_lock(&w->mu);
        if (!w->pending && !atomic_load(&w->stop)) {
            struct timespec ts;
            clock_wall_after(0.1, &ts);
            pthread_cond_timedwait(&w->cv, &w->mu, &ts);
        }
        w->pending = 0;
        pthread_mutex_unlock(&w->mu);
    }
    save_on_exit(w);
    eng_sched_close(w->sched);
    w->sched = NULL;
    pthread_mutex_lock(&w->mu);
    ranks *rk = w->rk;
    w->rk = NULL;
    pthread_mutex_unlock(&w->mu);
    /* the peers close their engines while rank 0 closes its own (NCCL's finalize waits for
     * every rank); the communicator goes last, once no engine uses it (ranks.h). With followers
     * the communicators are aborted first: a follower closes its engines only once this leader
     * is gone, so a finalize here would wait for it forever (seen on 2 H200s: the stop of a
     * leader with a live follower hung until SIGKILL) */
    if (ranks_has_remote(rk)) ranks_abort(rk);
    ranks_stop(rk);
    eng_close(w->e);
    w->e = NULL;
    cluster_detach(w->cfg.cluster);
    ranks_close(rk);
    store_close(w->st);
    w->st = NULL;
    log_event(LOG_INFO, "engine_stopped", NULL);
    atomic_store(&w->finished, 1);
    if (w->cfg.notify) w->cfg.notify(w->cfg.ud);
    return NULL;
}

int worker_start(const worker_config *c, worker **out) {
    *out = NULL;
    worker *w = calloc(1, sizeof *w);
    if (!w) return err_set(GE_NOMEM, "worker: out of memory");
    w->cfg = *c;
    snprintf(w->data_dir, sizeof w->data_dir, "%s", c->data_dir);
    snprintf(w->model_dir, sizeof w->model_dir, "%s", c->model_dir ? c->model_dir : "");
    snprintf(w->backend, sizeof w->backend, "%s", c->backend ? c->backend : "auto");
    snprintf(w->lora_targets, sizeof w->lora_targets, "%s", c->lora_targets ? c->lora_targets : "");
    snprintf(w->lora_init, sizeof w->lora_init, "%s", c->lora_init ? c->lora_init : "");
    snprintf(w->optimizer_offload, sizeof w->optimizer_offload, "%s", c->optimizer_offload ? c->optimizer_offload : "auto");
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    beat(w);
    if (pthread_create(&w->th, NULL, thread_main, w)) {
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
        free(w);
        return err_set(GE_INTERNAL, "cannot start the engine thread");
    }
    *out = w;
    return 0;
}

void worker_wake(worker *w) {
    pthread_mutex_lock(&w->mu);
    w->pending = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

void worker_stop(worker *w) {
    atomic_store(&w->stop, 1);
    /* a stop while the ranks wait in NCCL's set-up (a rank that never comes) ends that wait;
     * w->rk is cleared under mu before it is closed */
    pthread_mutex_lock(&w->mu);
    if (w->rk) ranks_cancel_open(w->rk);
    pthread_mutex_unlock(&w->mu);
    worker_wake(w);
}

int worker_finished(worker *w) { return atomic_load(&w->finished); }

void worker_join(worker *w) {
    pthread_join(w->th, NULL);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
}
