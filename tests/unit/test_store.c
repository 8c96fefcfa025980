/* test_store.c — the SQLite job queue: lifecycle of a job, FIFO claims, filters and counts,
 * key/value and checkpoint index, the dashboard history, crash recovery, the queue limit, claims racing from two
 * threads, durability of a submit against SIGKILL of the submitting process, and the job counts
 * the triggers keep (equal to a recount after random operations, and after a migration from a
 * database of the schema before them).
 * Each test works in its own fresh directory under /tmp. */
#include "common/err.h"
#include "store/store.h"
#include "tests/unit/check.h"

#include <ctype.h>
#include <pthread.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char tmp_root[256];

/* A fresh directory path (not yet created: store_open must create it). */
static const char *fresh_dir(char *buf, size_t n, const char *name) {
    snprintf(buf, n, "%s/%s/data", tmp_root, name);
    return buf;
}

static int is_job_id(const char *id) {
    if (strlen(id) != 18 || id[0] != 'j' || id[1] != '_') return 0;
    for (int i = 2; i < 18; i++)
        if (!isxdigit((unsigned char)id[i]) || isupper((unsigned char)id[i])) return 0;
    return 1;
}

TEST(test_open_creates_dir_and_schema) {
    char dir[512], file[600];
    fresh_dir(dir, sizeof dir, "open");
    store *s;
    int r = store_open(dir, 1, &s);
    CHECK_MSG(r == 0, "store_open: %s", err_msg());
    store_close(s);
    snprintf(file, sizeof file, "%s/grpod.db", dir);
    struct stat sb;
    CHECK(stat(file, &sb) == 0);
    sqlite3 *db;
    CHECK(sqlite3_open(file, &db) == SQLITE_OK);
    sqlite3_stmt *st;
    CHECK(sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st, NULL) == SQLITE_OK);
    CHECK(sqlite3_step(st) == SQLITE_ROW);
    int v = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    CHECK(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &st, NULL) == SQLITE_OK);
    CHECK(sqlite3_step(st) == SQLITE_ROW);
    char mode[16];
    snprintf(mode, sizeof mode, "%s", (const char *)sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    sqlite3_close(db);
    CHECK_EQ_INT(v, 4); /* migrations: v1 jobs/kv/checkpoints, v2 history, v3 job counts, v4 routes */
    CHECK_STR(mode, "wal");
    /* reopening an up-to-date database migrates nothing and works */
    r = store_open(dir, 0, &s);
    CHECK_MSG(r == 0, "reopen: %s", err_msg());
    store_close(s);
}

TEST(test_newer_schema_refused) {
    char dir[512], file[600];
    fresh_dir(dir, sizeof dir, "newer");
    store *s;
    CHECK(store_open(dir, 0, &s) == 0);
    store_close(s);
    snprintf(file, sizeof file, "%s/grpod.db", dir);
    sqlite3 *db;
    CHECK(sqlite3_open(file, &db) == SQLITE_OK);
    CHECK(sqlite3_exec(db, "PRAGMA user_version = 99", NULL, NULL, NULL) == SQLITE_OK);
    sqlite3_close(db);
    int r = store_open(dir, 0, &s);
    CHECK_EQ_INT(r, GE_STORE);
    CHECK(s == NULL);
    CHECK_MSG(strstr(err_msg(), "99") != NULL, "message: %s", err_msg());
}

TEST(test_submit_get) {
    char dir[512], id[32];
    store *s;
    CHECK(store_open(fresh_dir(dir, sizeof dir, "submit"), 1, &s) == 0);
    int r = store_submit(s, "rollout", "{\"groups\":[1]}", 0, id);
    CHECK_MSG(r == 0, "submit: %s", err_msg());
    CHECK_MSG(is_job_id(id), "id %s", id);
    store_job j;
    CHECK(store_get(s, id, &j) == 0);
    CHECK_STR(j.id, id);
    CHECK_STR(j.kind, "rollout");
    CHECK_EQ_INT(j.status, JOB_QUEUED);
    CHECK_STR(j.payload, "{\"groups\":[1]}");
    CHECK(j.result == NULL && j.error == NULL);
    CHECK(j.created_at > 1.6e9 && j.started_at == 0 && j.finished_at == 0);
    CHECK_EQ_INT(j.attempts, 0);
    CHECK_EQ_INT(j.policy_version, -1);
    CHECK_EQ_INT(j.cancel_requested, 0);
    store_job_clear(&j);
    CHECK_EQ_INT(store_get(s, "j_0000000000000000", &j), GE_NOT_FOUND);
    CHECK_EQ_INT(store_submit(s, "", "{}", 0, id), GE_INVALID);
    CHECK_EQ_INT(store_submit(s, "a_kind_far_too_long", "{}", 0, id), GE_INVALID);
    CHECK_EQ_INT(store_submit(s, "checkpoint", NULL, 0, id), 0); /* NULL payload stores {} */
    CHECK(store_get(s, id, &j) == 0);
    CHECK_STR(j.payload, "{}");
    store_job_clear(&j);
    CHECK_STR(store_status_name(JOB_CANCELLED), "cancelled");
    store_close(s);
}

/* A rollout's routes: a blob read back byte for byte (random bytes, NUL and 0xff included),
 * replaced by a second put, and deleted with its job by retention. */
TEST(test_routes) {
    char dir[512], id[32], other[32];
    store *s;
    CHECK(store_open(fresh_dir(dir, sizeof dir, "routes"), 1, &s) == 0);
    CHECK(store_submit(s, "rollout", "{}", 0, id) == 0);
    CHECK(store_submit(s, "rollout", "{}", 0, other) == 0);
    unsigned char blob[777];
    unsigned long long seed = 91;
    for (size_t i = 0; i < sizeof blob; i++) blob[i] = (unsigned char)((check_randf(&seed, 0.5f) + 0.5f) * 256);
    blob[3] = 0, blob[4] = 0xff;
    void *got;
    size_t n;
    CHECK_EQ_INT(store_routes_get(s, id, &got, &n), GE_NOT_FOUND);
    CHECK(store_routes_put(s, id, blob, 500) == 0);
    CHECK(store_routes_put(s, id, blob, sizeof blob) == 0); /* a rerun records them again */
    CHECK(store_routes_put(s, other, blob, 10) == 0);
    CHECK(store_routes_get(s, id, &got, &n) == 0);
    CHECK(n == sizeof blob && !memcmp(got, blob, n));
    free(got);
    store_job j;
    for (int i = 0; i < 2; i++) {
        CHECK_EQ_INT(store_claim(s, &j), 1);
        store_job_clear(&j);
    }
    CHECK(store_finish(s, id, "{}", 0) == 0);
    CHECK(store_finish(s, other, "{}", 0) == 0);
    CHECK_EQ_INT(store_retain(s, 1), 1); /* the older one goes, its routes with it */
    CHECK_EQ_INT(store_routes_get(s, id, &got, &n), GE_NOT_FOUND);
    CHECK(store_routes_get(s, other, &got, &n) == 0 && n == 10);
    free(got);
    store_close(s);
}

TEST(test_fifo_claim_finish_fail) {
    char dir[512], ids[5][32];
    store *s;
    CHECK(store_open(fresh_dir(dir, sizeof dir, "fifo"), 1, &s) == 0);
    for (int i = 0; i < 5; i++) CHECK(store_submit(s, "update", "{}", 0, ids[i]) == 0);
    CHECK_EQ_INT(store_queue_depth(s), 5);
    store_job j;
    for (int i = 0; i < 5; i++) {
        CHECK_EQ_INT(store_claim(s, &j), 1);
        CHECK_STR(j.id, ids[i]);
        CHECK_EQ_INT(j.status, JOB_RUNNING);
        CHECK_EQ_INT(j.attempts, 1);
        CHECK(j.started_at >= j.created_at);
        store_job_clear(&j);
    }
    CHECK_EQ_INT(store_claim(s, &j), 0);
    CHECK_EQ_INT(store_queue_depth(s), 0);

    CHECK(store_progress(s, ids[0], 0.5) == 0);
    CHECK(store_get(s, ids[0], &j) == 0);
    CHECK_CLOSE(j.progress, 0.5, 1e-12, 0);
    store_job_clear(&j);

    CHECK(store_finish(s, ids[0], "{\"ok\":true}", 7) == 0);
    CHECK(store_get(s, ids[0], &j) == 0);
    CHECK_EQ_INT(j.status, JOB_DONE);
    CHECK_STR(j.result, "{\"ok\":true}");
    CHECK_EQ_INT(j.policy_version, 7);
    CHECK(j.finished_at >= j.started_at && j.finished_at > 0);
    CHECK_CLOSE(j.progress, 1.0, 1e-12, 0);
    store_job_clear(&j);
    /* a finished job cannot finish twice nor fail nor go back to the queue */
    CHECK_EQ_INT(store_finish(s, ids[0], "{}", 8), GE_CONFLICT);
    CHECK_MSG(strstr(err_msg(), "done") != NULL, "message: %s", err_msg());
    CHECK_EQ_INT(store_fail(s, ids[0], "{}"), GE_CONFLICT);
    CHECK_EQ_INT(store_requeue(s, ids[0]), GE_CONFLICT);
    CHECK_EQ_INT(store_finish(s, "j_ffffffffffffffff", "{}", 1), GE_NOT_FOUND);

    CHECK(store_fail(s, ids[1], "{\"code\":\"internal\",\"message\":\"boom\"}") == 0);
    CHECK(store_get(s, ids[1], &j) == 0);
    CHECK_EQ_INT(j.status, JOB_FAILED);
    CHECK_STR(j.error, "{\"code\":\"internal\",\"message\":\"boom\"}");
    CHECK(j.result == NULL);
    store_job_clear(&j);

    /* a held job's start is stamped when it runs; only a running job can be */
    CHECK(store_get(s, ids[3], &j) == 0);
    double claimed_at = j.started_at;
    store_job_clear(&j);
    struct timespec pause = {0, 20 * 1000 * 1000};
    nanosleep(&pause, NULL);
    CHECK(store_mark_started(s, ids[3]) == 0);
    CHECK(store_get(s, ids[3], &j) == 0);
    CHECK_MSG(j.started_at >= claimed_at + 0.015, "started_at %.3f, claimed at %.3f", j.started_at, claimed_at);
    CHECK_EQ_INT(j.status, JOB_RUNNING);
    store_job_clear(&j);
    CHECK_EQ_INT(store_mark_started(s, ids[0]), GE_CONFLICT);

    /* requeue (shutdown): the job goes back and is claimed again with attempts 2 */
    CHECK(store_requeue(s, ids[2]) == 0);
    CHECK_EQ_INT(store_claim(s, &j), 1);
    CHECK_STR(j.id, ids[2]);
    CHECK_EQ_INT(j.attempts, 2);
    store_job_clear(&j);
    store_close(s);
}

TEST(test_cancel) {
    char dir[512], a[32], b[32], c[32];
    store *s;
    CHECK(store_open(fresh_dir(dir, sizeof dir, "cancel"), 1, &s) == 0);
    CHECK(store_submit(s, "rollout", "{}", 0, a) == 0);
    CHECK(store_submit(s, "rollout", "{}", 0, b) == 0);
    CHECK(store_submit(s, "rollout", "{}", 0, c) == 0);
    store_job j;
    CHECK_EQ_INT(store_claim(s, &j), 1); /* a is running */
    CHECK_STR(j.id, a);
    store_job_clear(&j);

    /* queued b: cancelled at once, never claimed */
    CHECK(store_cancel(s, b) == 0);
    CHECK(store_get(s, b, &j) == 0);
    CHECK_EQ_INT(j.status, JOB_CANCELLED);
    CHECK(j.finished_at > 0);
    store_job_clear(&j);
    CHECK_EQ_INT(store_cancel(s, b), GE_CONFLICT);

    /* running a: flagged, still running, until the engine marks it */
    CHECK_EQ_INT(store_cancel_requested(s, a), 0);
    CHECK(store_cancel(s, a) == 0);
    CHECK_EQ_INT(store_cancel_requested(s, a), 1);
    CHECK(store_get(s, a, &j) == 0);
    CHECK_EQ_INT(j.status, JOB_RUNNING);
    CHECK_EQ_INT(j.cancel_requested, 1);
    store_job_clear(&j);
    CHECK(store_mark_cancelled(s, a) == 0);
    CHECK(store_get(s, a, &j) == 0);
    CHECK_EQ_INT(j.status, JOB_CANCELLED);
    store_job_clear(&j);
    CHECK_EQ_INT(store_mark_cancelled(s, a), GE_CONFLICT);

    CHECK_EQ_INT(store_cancel(s, "j_0123456789abcdef"), GE_NOT_FOUND);
    CHECK_EQ_INT(store_cancel_requested(s, "j_0123456789abcdef"), GE_NOT_FOUND);

    CHECK_EQ_INT(store_claim(s, &j), 1); /* only c is left */
    CHECK_STR(j.id, c);
    store_job_clear(&j);
    CHECK(store_finish(s, c, "{}", 0) == 0);
    CHECK_EQ_INT(store_cancel(s, c), GE_CONFLICT);
    CHECK_EQ_INT(store_claim(s, &j), 0);
    store_close(s);
}

typedef struct {
    char kind[16], status[16];
    long long n;
} count_row;
typedef struct {
    count_row rows[16];
    int n;
} count_acc;
static void count_cb(void *ud, const char *kind, const char *status, long long n) {
    count_acc *a = ud;
    if (a->n < 16) {
        snprintf(a->rows[a->n].kind, 16, "%s", kind);
        snprintf(a->rows[a->n].status, 16, "%s", status);
        a->rows[a->n++].n = n;
    }
}
static long long count_of(const count_acc *a, const char *kind, const char *status) {
    for (int i = 0; i < a->n; i++)
        if (!strcmp(a->rows[i].kind, kind) && !strcmp(a->rows[i].status, status)) return a->rows[i].n;
    return 0;
}

/* Every (kind, status) count of the store against a GROUP BY over the jobs table itself. */
static int counts_match(store *s, const char *file) {
    count_acc kept = {0};
    if (store_counts(s, count_cb, &kept)) return 0;
    sqlite3 *db;
    sqlite3_stmt *st;
    if (sqlite3_open(file, &db) != SQLITE_OK) return 0;
    int ok = sqlite3_prepare_v2(db, "SELECT kind, status, count(*) FROM jobs GROUP BY kind, status", -1, &st, NULL) == SQLITE_OK;
    int rows = 0;
    while (ok && sqlite3_step(st) == SQLITE_ROW) {
        rows++;
        ok = count_of(&kept, (const char *)sqlite3_column_text(st, 0), (const char *)sqlite3_column_text(st, 1)) ==
            sqlite3_column_int64(st, 2);
    }
    sqlite3_finalize(st);
    sqlite3_close(db);
    return ok && rows == kept.n;
}

TEST(test_counts_kept_equal_a_recount) {
    char dir[512], file[600], ids[64][32];
    const char *d = fresh_dir(dir, sizeof dir, "counts");
    snprintf(file, sizeof file, "%s/grpod.db", d);
    store *s;
    CHECK(store_open(d, 1, &s) == 0);
    /* a database of schema v2 with jobs in it: the migration counts what is there */
    store_close(s);
    sqlite3 *db;
    CHECK(sqlite3_open(file, &db) == SQLITE_OK);
    CHECK(sqlite3_exec(db,
                       "DROP TRIGGER jobs_count_insert; DROP TRIGGER jobs_count_delete; DROP TRIGGER jobs_count_status;"
                       "DROP TABLE job_counts; DROP TRIGGER jobs_delete_routes; DROP TABLE routes;"
                       "INSERT INTO jobs (id, kind, status, payload, created_at) VALUES "
                       "('j_00000000000000a1', 'rollout', 'done', '{}', 1), ('j_00000000000000a2', 'update', 'failed', '{}', 2),"
                       "('j_00000000000000a3', 'rollout', 'done', '{}', 3), ('j_00000000000000a4', 'update', 'queued', '{}', 4);"
                       "PRAGMA user_version = 2;",
                       NULL, NULL, NULL) == SQLITE_OK);
    sqlite3_close(db);
    CHECK(store_open(d, 1, &s) == 0);
    CHECK(counts_match(s, file));
    CHECK_EQ_INT(store_queue_depth(s), 1);
    /* random operations, each followed by a recount */
    const char *kinds[3] = {"rollout", "update", "checkpoint"};
    unsigned long long rng = 0x5eedULL;
    int n = 0, bad = 0;
    for (int step = 0; step < 300 && !bad; step++) {
        rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
        int op = (int)(rng >> 59) % 8, k = (int)(rng >> 40) % 3, pick = n ? (int)((rng >> 20) % (unsigned)n) : 0;
        store_job j;
        err_clear();
        if (op <= 2 && n < 64) {
            CHECK(store_submit(s, kinds[k], "{}", 0, ids[n]) == 0);
            n++;
        } else if (op == 3) {
            if (store_claim(s, &j) == 1) store_job_clear(&j);
        } else if (op == 4 && n) {
            store_finish(s, ids[pick], "{}", 1); /* not running: refused, nothing changes */
        } else if (op == 5 && n) {
            store_fail(s, ids[pick], "{\"code\":\"x\"}");
        } else if (op == 6 && n) {
            store_cancel(s, ids[pick]);
        } else if (op == 7 && n) {
            if (rng >> 63) store_requeue(s, ids[pick]);
            else store_requeue_failed(s, ids[pick]);
        }
        if (!counts_match(s, file)) {
            printf("  step %d (op %d): counts differ from a recount\n", step, op);
            bad = 1;
        }
    }
    CHECK(!bad);
    store_close(s);
    /* recovery at open (running -> queued, cancel-requested -> cancelled) keeps them too */
    CHECK(store_open(d, 1, &s) == 0);
    CHECK(counts_match(s, file));
    store_close(s);
}

TEST(test_list_counts) {
    char dir[512], ids[7][32];
    store *s;
    CHECK(store_open(fresh_dir(dir, sizeof dir, "list"), 1, &s) == 0);
    const char *kinds[7] = {"rollout", "update", "rollout", "rollout", "update", "checkpoint", "rollout"};
    for (int i = 0; i < 7; i++) CHECK(store_submit(s, kinds[i], "{}", 0, ids[i]) == 0);
    store_job j;
    CHECK_EQ_INT(store_claim(s, &j), 1); /* ids[0] rollout running */
    store_job_clear(&j);
    CHECK_EQ_INT(store_claim(s, &j), 1); /* ids[1] update running */
    store_job_clear(&j);
    CHECK(store_finish(s, ids[1], "{}", 1) == 0); /* update done */

    store_job *v;
    int n;
    CHECK(store_list(s, NULL, NULL, 0, 0, &v, &n) == 0);
    CHECK_EQ_INT(n, 7);
    for (int i = 0; i < 7; i++) CHECK_STR(v[i].id, ids[6 - i]); /* newest first */
    store_jobs_free(v, n);

    CHECK(store_list(s, "rollout", NULL, 0, 0, &v, &n) == 0);
    CHECK_EQ_INT(n, 4);
    CHECK_STR(v[0].id, ids[6]);
    CHECK_STR(v[3].id, ids[0]);
    store_jobs_free(v, n);

    CHECK(store_list(s, "rollout", "queued", 2, 0, &v, &n) == 0);
    CHECK_EQ_INT(n, 2);
    CHECK_STR(v[0].id, ids[6]);
    CHECK_STR(v[1].id, ids[3]);
    CHECK_EQ_INT(v[0].status, JOB_QUEUED);
    store_jobs_free(v, n);

    CHECK(store_list(s, NULL, "done", 10, 0, &v, &n) == 0);
    CHECK_EQ_INT(n, 1);
    CHECK_STR(v[0].id, ids[1]);
    store_jobs_free(v, n);

    CHECK(store_list(s, "nothing", NULL, 10, 0, &v, &n) == 0);
    CHECK_EQ_INT(n, 0);
    store_jobs_free(v, n);


    count_acc acc = {0};
    CHECK(store_counts(s, count_cb, &acc) == 0);
    CHECK_EQ_INT(count_of(&acc, "rollout", "queued"), 3);
    CHECK_EQ_INT(count_of(&acc, "rollout", "running"), 1);
    CHECK_EQ_INT(count_of(&acc, "update", "done"), 1);
    CHECK_EQ_INT(count_of(&acc, "update", "queued"), 1);
    CHECK_EQ_INT(count_of(&acc, "checkpoint", "queued"), 1);
    CHECK_EQ_INT(acc.n, 5);
    CHECK_EQ_INT(store_queue_depth(s), 5);
    /* pages: 3 at a time from a cursor, newest first, not moved by a job added meanwhile */
    store_job *p1, *p2, *p3;
    int n1, n2, n3;
    CHECK(store_list(s, NULL, NULL, 3, 0, &p1, &n1) == 0 && n1 == 3);
    char late[32];
    CHECK(store_submit(s, "rollout", "{}", 0, late) == 0);
    CHECK(store_list(s, NULL, NULL, 3, p1[2].seq, &p2, &n2) == 0 && n2 == 3);
    CHECK(store_list(s, NULL, NULL, 3, p2[2].seq, &p3, &n3) == 0 && n3 == 1);
    for (int i = 0; i < 3; i++) {
        CHECK_STR(p1[i].id, ids[6 - i]);
        CHECK_STR(p2[i].id, ids[3 - i]);
    }
    CHECK_STR(p3[0].id, ids[0]);
    store_jobs_free(p1, n1);
    store_jobs_free(p2, n2);
    store_jobs_free(p3, n3);
    store_close(s);
}

TEST(test_checkpoints) {
    char dir[512];
    store *s;
    CHECK(store_open(fresh_dir(dir, sizeof dir, "ckpt"), 1, &s) == 0);
    store_ckpt *c;
    int n;
    CHECK(store_checkpoint_list(s, &c, &n) == 0);
    CHECK_EQ_INT(n, 0);
    free(c);
    CHECK(store_checkpoint_add(s, "ckpt_a", "/data/ckpt/a", 1) == 0);
    CHECK(store_checkpoint_add(s, "ckpt_b", "/data/ckpt/b", 5) == 0);
    /* an id added again (a checkpoint job re-run after a crash before its done-write): one row,
     * updated, in its first place */
    CHECK(store_checkpoint_add(s, "ckpt_a", "/data/ckpt/a2", 1) == 0);
    store_close(s);

    /* they survive a reopen */
    CHECK(store_open(dir, 1, &s) == 0);
    CHECK(store_checkpoint_list(s, &c, &n) == 0);
    CHECK_EQ_INT(n, 2);
    CHECK_STR(c[0].id, "ckpt_b");
    CHECK_STR(c[0].path, "/data/ckpt/b");
    CHECK_EQ_INT(c[0].policy_version, 5);
    CHECK_STR(c[1].id, "ckpt_a");
    CHECK_STR(c[1].path, "/data/ckpt/a2");
    CHECK(c[1].created_at > 1.6e9 && c[0].created_at >= c[1].created_at);
    free(c);
    store_close(s);
}

typedef struct {
    long long id[8], pv[8];
    char kind[8][16], stats[8][64];
    int n;
} hist_seen;
static void hist_cb(void *ud, long long id, double at, const char *kind, long long pv, const char *stats) {
    hist_seen *h = ud;
    if (h->n == 8 || at < 1.6e9) return;
    h->id[h->n] = id;
    h->pv[h->n] = pv;
    snprintf(h->kind[h->n], sizeof h->kind[0], "%s", kind);
    snprintf(h->stats[h->n], sizeof h->stats[0], "%s", stats);
    h->n++;
}

/* history rows come back oldest first; after skips, limit keeps the newest; they survive a reopen */
TEST(test_history) {
    char dir[512];
    store *s;
    CHECK(store_open(fresh_dir(dir, sizeof dir, "hist"), 1, &s) == 0);
    CHECK(store_history_add(s, "rollout", 0, "{\"reward_mean\":0.25}") == 0);
    CHECK(store_history_add(s, "update", 1, "{\"loss\":-0.5}") == 0);
    CHECK(store_history_add(s, "rollout", 1, "{\"reward_mean\":0.5}") == 0);
    store_close(s);
    CHECK(store_open(dir, 1, &s) == 0);
    hist_seen h = {0};
    CHECK(store_history_list(s, 0, 100, hist_cb, &h) == 0);
    CHECK_EQ_INT(h.n, 3);
    CHECK_STR(h.kind[1], "update");
    CHECK_EQ_INT(h.pv[1], 1);
    CHECK_STR(h.stats[2], "{\"reward_mean\":0.5}");
    CHECK(h.id[0] < h.id[1] && h.id[1] < h.id[2]);
    long long first = h.id[0];
    memset(&h, 0, sizeof h);
    CHECK(store_history_list(s, first, 100, hist_cb, &h) == 0); /* after the first */
    CHECK_EQ_INT(h.n, 2);
    CHECK_STR(h.kind[0], "update");
    memset(&h, 0, sizeof h);
    CHECK(store_history_list(s, 0, 1, hist_cb, &h) == 0); /* the newest one */
    CHECK_EQ_INT(h.n, 1);
    CHECK_STR(h.stats[0], "{\"reward_mean\":0.5}");
    store_close(s);
}

TEST(test_recovery) {
    char dir[512], ids[3][32];
    store *s;
    CHECK(store_open(fresh_dir(dir, sizeof dir, "recover"), 1, &s) == 0);
    for (int i = 0; i < 3; i++) CHECK(store_submit(s, "rollout", "{}", 0, ids[i]) == 0);
    store_job j;
    CHECK_EQ_INT(store_claim(s, &j), 1);
    store_job_clear(&j);
    store_close(s); /* "crash" with ids[0] running */

    CHECK(store_open(dir, 0, &s) == 0); /* recover = 0 leaves it running */
    CHECK(store_get(s, ids[0], &j) == 0);
    CHECK_EQ_INT(j.status, JOB_RUNNING);
    store_job_clear(&j);
    store_close(s);

    CHECK(store_open(dir, 1, &s) == 0);
    CHECK_EQ_INT(store_queue_depth(s), 3);
    CHECK(store_get(s, ids[0], &j) == 0);
    CHECK_EQ_INT(j.status, JOB_QUEUED);
    CHECK_EQ_INT(j.attempts, 1);
    store_job_clear(&j);
    /* it keeps its place at the head of the queue and counts a second attempt */
    CHECK_EQ_INT(store_claim(s, &j), 1);
    CHECK_STR(j.id, ids[0]);
    CHECK_EQ_INT(j.attempts, 2);
    store_job_clear(&j);
    /* a running job whose cancel was asked for is cancelled at recovery, not rerun */
    CHECK(store_cancel(s, ids[0]) == 0);
    store_close(s);
    CHECK(store_open(dir, 1, &s) == 0);
    CHECK(store_get(s, ids[0], &j) == 0);
    CHECK_EQ_INT(j.status, JOB_CANCELLED);
    store_job_clear(&j);
    CHECK_EQ_INT(store_queue_depth(s), 2);
    store_close(s);
}

TEST(test_fail_exhausted) {
    char dir[512], a[32], b[32];
    store *s;
    CHECK(store_open(fresh_dir(dir, sizeof dir, "exhaust"), 1, &s) == 0);
    CHECK(store_submit(s, "update", "{}", 0, a) == 0);
    CHECK(store_submit(s, "update", "{}", 0, b) == 0);
    store_job j;
    for (int crash = 0; crash < 3; crash++) { /* a crashes the daemon three times */
        CHECK_EQ_INT(store_claim(s, &j), 1);
        CHECK_STR(j.id, a);
        store_job_clear(&j);
        store_close(s);
        CHECK(store_open(dir, 1, &s) == 0);
        CHECK_EQ_INT(store_fail_exhausted(s, 3), crash == 2 ? 1 : 0);
    }
    CHECK(store_get(s, a, &j) == 0);
    CHECK_EQ_INT(j.status, JOB_FAILED);
    CHECK_EQ_INT(j.attempts, 3);
    CHECK_MSG(j.error && strstr(j.error, "interrupted 3 times"), "error %s", j.error ? j.error : "(null)");
    store_job_clear(&j);
    CHECK_EQ_INT(store_claim(s, &j), 1); /* b was never started: unaffected */
    CHECK_STR(j.id, b);
    store_job_clear(&j);
    store_close(s);
}

TEST(test_max_queued) {
    char dir[512], id[32];
    store *s;
    CHECK(store_open(fresh_dir(dir, sizeof dir, "maxq"), 1, &s) == 0);
    for (int i = 0; i < 3; i++) CHECK(store_submit(s, "rollout", "{}", 3, id) == 0);
    CHECK_EQ_INT(store_submit(s, "rollout", "{}", 3, id), GE_BUSY);
    CHECK_EQ_INT(store_queue_depth(s), 3);
    store_job j;
    CHECK_EQ_INT(store_claim(s, &j), 1); /* running jobs do not count as queued */
    store_job_clear(&j);
    CHECK(store_submit(s, "rollout", "{}", 3, id) == 0);
    CHECK_EQ_INT(store_submit(s, "rollout", "{}", 3, id), GE_BUSY);
    CHECK(store_submit(s, "rollout", "{}", 0, id) == 0); /* 0 = no limit */
    CHECK_EQ_INT(store_queue_depth(s), 4);
    store_close(s);
}

/* ---------------------------------------------------------------- two threads claiming */

#define RACE_JOBS 200
typedef struct {
    const char *dir;
    char (*claimed)[32];
    int n;
    int err;
    pthread_barrier_t *go;
} claimer;

static void *claim_loop(void *arg) {
    claimer *c = arg;
    store *s;
    int opened = store_open(c->dir, 0, &s);
    pthread_barrier_wait(c->go); /* both connections open before either claims */
    if (opened) {
        c->err = 1;
        return NULL;
    }
    for (;;) {
        store_job j;
        int r = store_claim(s, &j);
        if (r < 0) {
            c->err = 2;
            break;
        }
        if (r == 0) break;
        memcpy(c->claimed[c->n++], j.id, 32);
        if (store_finish(s, j.id, "{}", 0)) c->err = 3;
        store_job_clear(&j);
        usleep(1000); /* "work" outside the lock, so the two threads' claims interleave */
    }
    store_close(s);
    return NULL;
}

static int cmp_id(const void *a, const void *b) { return strcmp(a, b); }

TEST(test_concurrent_claims) {
    char dir[512];
    static char ids[RACE_JOBS][32], got[2][RACE_JOBS][32], all[2 * RACE_JOBS][32];
    store *s;
    CHECK(store_open(fresh_dir(dir, sizeof dir, "race"), 1, &s) == 0);
    for (int i = 0; i < RACE_JOBS; i++) CHECK(store_submit(s, "rollout", "{}", 0, ids[i]) == 0);
    store_close(s);
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, 2);
    claimer c[2] = {{dir, got[0], 0, 0, &go}, {dir, got[1], 0, 0, &go}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++) CHECK(pthread_create(&t[i], NULL, claim_loop, &c[i]) == 0);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    pthread_barrier_destroy(&go);
    CHECK_MSG(c[0].err == 0 && c[1].err == 0, "thread errors %d %d", c[0].err, c[1].err);
    CHECK_EQ_INT(c[0].n + c[1].n, RACE_JOBS);
    memcpy(all, got[0], (size_t)c[0].n * 32);
    memcpy(all + c[0].n, got[1], (size_t)c[1].n * 32);
    qsort(all, RACE_JOBS, 32, cmp_id);
    qsort(ids, RACE_JOBS, 32, cmp_id);
    for (int i = 0; i < RACE_JOBS; i++) CHECK_STR(all[i], ids[i]); /* each exactly once */
    printf("# claims split %d / %d between threads\n", c[0].n, c[1].n);

    CHECK(store_open(dir, 0, &s) == 0);
    store_job *v;
    int n;
    CHECK(store_list(s, NULL, "done", 0, 0, &v, &n) == 0);
    store_jobs_free(v, n);
    CHECK_EQ_INT(n, RACE_JOBS);
    CHECK(store_list(s, NULL, NULL, 0, 0, &v, &n) == 0);
    for (int i = 0; i < n; i++) CHECK_EQ_INT(v[i].attempts, 1);
    store_jobs_free(v, n);
    store_close(s);
}

/* ---------------------------------------------------------------- SIGKILL durability */

TEST(test_sigkill_durability) {
    char dir[512];
    fresh_dir(dir, sizeof dir, "kill");
    store *s;
    CHECK(store_open(dir, 1, &s) == 0); /* schema exists before the child starts */
    store_close(s);
    int fd[2];
    CHECK(pipe(fd) == 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        close(fd[0]);
        store *cs;
        if (store_open(dir, 0, &cs)) _exit(2);
        for (int i = 0; i < 100000; i++) {
            char id[32], line[40];
            if (store_submit(cs, "rollout", "{\"i\":1}", 0, id)) _exit(3);
            int len = snprintf(line, sizeof line, "%s\n", id);
            if (write(fd[1], line, (size_t)len) != len) _exit(4);
        }
        _exit(0);
    }
    close(fd[1]);
    /* read until 40 ids have been acknowledged, then kill the child mid-stream */
    static char buf[1 << 16];
    size_t have = 0;
    int lines = 0;
    while (lines < 40) {
        ssize_t r = read(fd[0], buf + have, sizeof buf - 1 - have);
        if (r <= 0) break;
        for (ssize_t i = 0; i < r; i++) lines += buf[have + i] == '\n';
        have += (size_t)r;
    }
    kill(pid, SIGKILL);
    ssize_t r; /* whatever the child wrote before dying was acknowledged too */
    while (have < sizeof buf - 1 && (r = read(fd[0], buf + have, sizeof buf - 1 - have)) > 0) have += (size_t)r;
    buf[have] = 0;
    close(fd[0]);
    int status;
    waitpid(pid, &status, 0);
    CHECK_MSG(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "child status %d", status);

    CHECK(store_open(dir, 1, &s) == 0);
    int checked = 0;
    for (char *line = buf, *nl; (nl = strchr(line, '\n')); line = nl + 1) {
        *nl = 0;
        store_job j;
        int g = store_get(s, line, &j);
        if (g) {
            store_close(s);
            FAILF("acknowledged job %s lost: %s", line, err_msg());
        }
        if (j.status != JOB_QUEUED || strcmp(j.payload, "{\"i\":1}")) {
            store_job_clear(&j);
            store_close(s);
            FAILF("job %s damaged", line);
        }
        store_job_clear(&j);
        checked++;
    }
    long long depth = store_queue_depth(s);
    store_close(s);
    CHECK(checked >= 40);
    CHECK(depth >= checked && depth <= checked + 1); /* at most one committed, unprinted */
    printf("# %d acknowledged jobs all present after SIGKILL (%lld in the queue)\n", checked, depth);
}

int main(void) {
    snprintf(tmp_root, sizeof tmp_root, "/tmp/grpod-test-store-XXXXXX");
    if (!mkdtemp(tmp_root)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(test_open_creates_dir_and_schema);
    RUN(test_newer_schema_refused);
    RUN(test_submit_get);
    RUN(test_fifo_claim_finish_fail);
    RUN(test_routes);
    RUN(test_cancel);
    RUN(test_list_counts);
    RUN(test_counts_kept_equal_a_recount);
    RUN(test_checkpoints);
    RUN(test_history);
    RUN(test_recovery);
    RUN(test_fail_exhausted);
    RUN(test_max_queued);
    RUN(test_concurrent_claims);
    RUN(test_sigkill_durability);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_root);
    if (!check_failed_ && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp_root);
    return CHECK_DONE();
}
