/* store.c — grpod's durable job queue and checkpoint index in SQLite.
 *
 * One file DIR/grpod.db in WAL mode with synchronous=FULL: a commit has reached the disk when
 * it returns, so a job the client saw 202 for survives kill -9 and power loss. The schema is
 * migrated by PRAGMA user_version: migrations[] below, one step per version, appended to and
 * never edited. Every statement is prepared once per handle at open.
 *
 * Threading: a handle (one SQLite connection) belongs to one thread; threads open their own.
 * Writers that read-then-write (submit with a queue limit, claim, cancel) run in BEGIN
 * IMMEDIATE transactions, so they are atomic across connections and processes; SQLite's busy
 * timeout makes the losers wait instead of failing.
 *
 * Not here: JSON (payloads/results are opaque text), HTTP, CUDA. */
#include "store/store.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/fsutil.h"

#include <errno.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define STORE_BUSY_TIMEOUT_MS 10000

/* ---------------------------------------------------------------- schema and migrations */

/* migrations[v] takes the schema from user_version v to v + 1. Append only. */
static const char *const migrations[] = {
    /* v1: jobs, key/value state, checkpoints index */
    "CREATE TABLE jobs ("
    "  id TEXT PRIMARY KEY NOT NULL,"
    "  kind TEXT NOT NULL,"
    "  status TEXT NOT NULL CHECK (status IN ('queued','running','done','failed','cancelled')),"
    "  payload TEXT NOT NULL,"
    "  result TEXT,"
    "  error TEXT,"
    "  created_at REAL NOT NULL,"
    "  started_at REAL NOT NULL DEFAULT 0,"
    "  finished_at REAL NOT NULL DEFAULT 0,"
    "  attempts INTEGER NOT NULL DEFAULT 0,"
    "  policy_version INTEGER NOT NULL DEFAULT -1,"
    "  progress REAL NOT NULL DEFAULT 0,"
    "  cancel_requested INTEGER NOT NULL DEFAULT 0);"
    "CREATE INDEX jobs_status_created ON jobs (status, created_at);"
    "CREATE TABLE kv (key TEXT PRIMARY KEY NOT NULL, value TEXT NOT NULL);" /* unused; kept: schema v1 */
    "CREATE TABLE checkpoints ("
    "  id TEXT PRIMARY KEY NOT NULL,"
    "  path TEXT NOT NULL,"
    "  policy_version INTEGER NOT NULL,"
    "  created_at REAL NOT NULL);",
    /* v2: training history for the dashboard, one row per finished rollout or update */
    "CREATE TABLE history ("
    "  id INTEGER PRIMARY KEY AUTOINCREMENT,"
    "  at REAL NOT NULL,"
    "  kind TEXT NOT NULL,"
    "  policy_version INTEGER NOT NULL,"
    "  stats TEXT NOT NULL);",
    /* v3: job counts by kind and status kept by triggers, so counting (a /metrics scrape, the
     * queue limit of a submit) reads a handful of rows however many jobs are stored */
    "CREATE TABLE job_counts ("
    "  kind TEXT NOT NULL,"
    "  status TEXT NOT NULL,"
    "  n INTEGER NOT NULL,"
    "  PRIMARY KEY (kind, status)) WITHOUT ROWID;"
    "INSERT INTO job_counts SELECT kind, status, count(*) FROM jobs GROUP BY kind, status;"
    "CREATE TRIGGER jobs_count_insert AFTER INSERT ON jobs BEGIN"
    "  INSERT INTO job_counts VALUES (NEW.kind, NEW.status, 1)"
    "    ON CONFLICT (kind, status) DO UPDATE SET n = n + 1;"
    " END;"
    "CREATE TRIGGER jobs_count_delete AFTER DELETE ON jobs BEGIN"
    "  UPDATE job_counts SET n = n - 1 WHERE kind = OLD.kind AND status = OLD.status;"
    " END;"
    "CREATE TRIGGER jobs_count_status AFTER UPDATE OF status ON jobs WHEN OLD.status <> NEW.status BEGIN"
    "  UPDATE job_counts SET n = n - 1 WHERE kind = OLD.kind AND status = OLD.status;"
    "  INSERT INTO job_counts VALUES (NEW.kind, NEW.status, 1)"
    "    ON CONFLICT (kind, status) DO UPDATE SET n = n + 1;"
    " END;",
    /* v4: a rollout's MoE routes (routing replay), an opaque blob per job, deleted with it */
    "CREATE TABLE routes (job_id TEXT PRIMARY KEY NOT NULL, data BLOB NOT NULL);"
    "CREATE TRIGGER jobs_delete_routes AFTER DELETE ON jobs BEGIN"
    "  DELETE FROM routes WHERE job_id = OLD.id;"
    " END;",
};
#define N_MIGRATIONS ((int)(sizeof migrations / sizeof migrations[0]))

/* ---------------------------------------------------------------- prepared statements */

#define JOB_COLS \
    "id, kind, status, payload, result, error, created_at, started_at, " \
    "finished_at, attempts, policy_version, progress, cancel_requested, rowid"

enum {
    Q_BEGIN,
    Q_COMMIT,
    Q_ROLLBACK,
    Q_COUNT_QUEUED,
    Q_INSERT,
    Q_CLAIM,
    Q_STARTED,
    Q_FINISH,
    Q_FAIL,
    Q_REQUEUE,
    Q_PROGRESS,
    Q_STATUS,
    Q_CANCEL_QUEUED,
    Q_FLAG_CANCEL,
    Q_MARK_CANCELLED,
    Q_CANCEL_REQ,
    Q_GET,
    Q_LIST,
    Q_COUNTS,
    Q_CKPT_ADD,
    Q_CKPT_LIST,
    Q_RECOVER_CANCELLED,
    Q_RECOVER,
    Q_FAIL_EXHAUSTED,
    Q_HIST_ADD,
    Q_HIST_LIST,
    Q_UPDATES_AFTER,
    Q_MAX_UPDATE_VERSION,
    Q_REQUEUE_FAILED,
    Q_CKPT_DEL,
    Q_PRUNE_INPUTS,
    Q_RETAIN,
    Q_SIZE,
    Q_ROUTES_PUT,
    Q_ROUTES_GET,
    Q_N
};
static const char *const sql_text[Q_N] = {
    [Q_BEGIN] = "BEGIN IMMEDIATE",
    [Q_COMMIT] = "COMMIT",
    [Q_ROLLBACK] = "ROLLBACK",
    [Q_COUNT_QUEUED] = "SELECT coalesce(sum(n), 0) FROM job_counts WHERE status = 'queued'",
    [Q_INSERT] = "INSERT INTO jobs (id, kind, status, payload, created_at) "
                 "VALUES (?1, ?2, 'queued', ?3, ?4)",
    /* the oldest queued job; rowid breaks ties of equal timestamps in insertion order */
    [Q_CLAIM] = "UPDATE jobs SET status = 'running', started_at = ?1, attempts = attempts + 1 "
                "WHERE rowid = (SELECT rowid FROM jobs WHERE status = 'queued' "
                "               ORDER BY created_at, rowid LIMIT 1) RETURNING " JOB_COLS,
    [Q_STARTED] = "UPDATE jobs SET started_at = ?2 WHERE id = ?1 AND status = 'running'",
    [Q_FINISH] = "UPDATE jobs SET status = 'done', result = ?2, policy_version = ?3, "
                 "finished_at = ?4, progress = 1 WHERE id = ?1 AND status = 'running'",
    [Q_FAIL] = "UPDATE jobs SET status = 'failed', error = ?2, finished_at = ?3 "
               "WHERE id = ?1 AND status IN ('queued', 'running')",
    [Q_REQUEUE] = "UPDATE jobs SET status = 'queued', progress = 0 "
                  "WHERE id = ?1 AND status = 'running'",
    [Q_PROGRESS] = "UPDATE jobs SET progress = ?2 WHERE id = ?1 AND status = 'running'",
    [Q_STATUS] = "SELECT status FROM jobs WHERE id = ?1",
    [Q_CANCEL_QUEUED] = "UPDATE jobs SET status = 'cancelled', cancel_requested = 1, "
                        "finished_at = ?2 WHERE id = ?1 AND status = 'queued'",
    [Q_FLAG_CANCEL] = "UPDATE jobs SET cancel_requested = 1 WHERE id = ?1 AND status = 'running'",
    [Q_MARK_CANCELLED] = "UPDATE jobs SET status = 'cancelled', finished_at = ?2 "
                         "WHERE id = ?1 AND status = 'running'",
    [Q_CANCEL_REQ] = "SELECT cancel_requested FROM jobs WHERE id = ?1",
    [Q_GET] = "SELECT " JOB_COLS " FROM jobs WHERE id = ?1",
    /* newest first by insertion order (rowid), from before ?4 (a cursor: jobs added since do
     * not move a page) */
    [Q_LIST] = "SELECT " JOB_COLS " FROM jobs WHERE (?1 IS NULL OR kind = ?1) "
               "AND (?2 IS NULL OR status = ?2) AND (?4 <= 0 OR rowid < ?4) ORDER BY rowid DESC LIMIT ?3",
    [Q_COUNTS] = "SELECT kind, status, n FROM job_counts WHERE n > 0 ORDER BY 1, 2",
    /* a checkpoint job run again after a crash between this and its done-write adds its row
     * again: the row stays (and keeps its place in the order) */
    [Q_CKPT_ADD] = "INSERT INTO checkpoints (id, path, policy_version, created_at) "
                   "VALUES (?1, ?2, ?3, ?4) ON CONFLICT (id) DO UPDATE SET path = excluded.path, "
                   "policy_version = excluded.policy_version",
    [Q_CKPT_LIST] = "SELECT id, path, policy_version, created_at FROM checkpoints "
                    "ORDER BY created_at DESC, rowid DESC",
    /* a job whose cancel was requested while it ran is not worth restarting */
    [Q_RECOVER_CANCELLED] = "UPDATE jobs SET status = 'cancelled', finished_at = ?1 "
                            "WHERE status = 'running' AND cancel_requested != 0",
    [Q_RECOVER] = "UPDATE jobs SET status = 'queued', progress = 0 WHERE status = 'running'",
    [Q_FAIL_EXHAUSTED] = "UPDATE jobs SET status = 'failed', finished_at = ?2, error = "
                         "'{\"code\":\"interrupted\",\"message\":\"job interrupted ' || attempts || "
                         "' times (daemon crash or shutdown while it ran); not retried (POST /v1/jobs/{id}/requeue "
                         "runs it again)\"}' WHERE status = 'queued' AND attempts >= ?1",
    /* the updates whose effect a resume from a checkpoint at version ?1 lacks, in the order
     * they were applied: each done update holds the version it made (policy_version + 1) */
    [Q_UPDATES_AFTER] = "SELECT " JOB_COLS " FROM jobs WHERE kind = 'update' AND status = 'done' "
                        "AND policy_version > ?1 ORDER BY policy_version, finished_at, rowid",
    [Q_MAX_UPDATE_VERSION] = "SELECT coalesce(max(policy_version), -1) FROM jobs "
                             "WHERE kind = 'update' AND status = 'done'",
    [Q_REQUEUE_FAILED] = "UPDATE jobs SET status = 'queued', attempts = 0, progress = 0, error = NULL, "
                         "finished_at = 0, cancel_requested = 0 WHERE id = ?1 AND status = 'failed'",
    [Q_CKPT_DEL] = "DELETE FROM checkpoints WHERE id = ?1",
    /* finished jobs beyond the newest ?1, but never a done update whose inputs replay may still
     * read (not yet pruned by store_prune_inputs), nor a rollout that such an update or a
     * queued or running one names */
    [Q_RETAIN] = "DELETE FROM jobs WHERE status IN ('done','failed','cancelled') "
                 "AND NOT (kind = 'update' AND status = 'done' AND payload <> '{}') "
                 "AND id NOT IN (SELECT json_extract(payload, '$.rollout_job_id') FROM jobs WHERE kind = 'update' "
                 "  AND (status IN ('queued','running') OR (status = 'done' AND payload <> '{}')) "
                 "  AND json_extract(payload, '$.rollout_job_id') IS NOT NULL) "
                 "AND id NOT IN (SELECT id FROM jobs WHERE status IN ('done','failed','cancelled') "
                 "  ORDER BY finished_at DESC, rowid DESC LIMIT ?1)",
    [Q_SIZE] = "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()",
    /* a rollout run again after a crash before its done-write records its routes again */
    [Q_ROUTES_PUT] = "INSERT INTO routes (job_id, data) VALUES (?1, ?2) "
                     "ON CONFLICT (job_id) DO UPDATE SET data = excluded.data",
    [Q_ROUTES_GET] = "SELECT data FROM routes WHERE job_id = ?1",
    [Q_PRUNE_INPUTS] = "UPDATE jobs SET payload = '{}' WHERE kind = 'update' AND status = 'done' "
                       "AND policy_version >= 0 AND policy_version <= ?1 AND payload <> '{}'",
    [Q_HIST_ADD] = "INSERT INTO history (at, kind, policy_version, stats) VALUES (?1, ?2, ?3, ?4)",
    /* the newest ?2 rows after id ?1, oldest first */
    [Q_HIST_LIST] = "SELECT id, at, kind, policy_version, stats FROM "
                    "(SELECT * FROM history WHERE id > ?1 ORDER BY id DESC LIMIT ?2) ORDER BY id",
};

struct store {
    sqlite3 *db;
    sqlite3_stmt *q[Q_N];
    char file[4200]; /* DIR/grpod.db */
    dev_t dev; /* its identity at open: a file replaced or deleted since */
    ino_t ino; /* is not the one this connection writes (store_check_file) */
};

static const char *const status_names[] = {"queued", "running", "done", "failed", "cancelled"};

const char *store_status_name(store_status s) { return (unsigned)s < 5 ? status_names[s] : "unknown"; }

static int status_parse(const char *name) {
    for (int i = 0; i < 5; i++)
        if (name && !strcmp(name, status_names[i])) return i;
    return -1;
}

/* ---------------------------------------------------------------- low-level helpers */

/* GE_STORE with SQLite's own message and what we were doing. */
static int db_err(store *s, const char *what) {
    return err_set(GE_STORE, "store: %s: %s", what, s->db ? sqlite3_errmsg(s->db) : "no database");
}

/* A reset, unbound statement ready for binding. */
static sqlite3_stmt *q_get(store *s, int which) {
    sqlite3_stmt *st = s->q[which];
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    return st;
}

/* Releases the statement's locks and bound pointers. */
static void q_done(sqlite3_stmt *st) {
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
}

#define BIND_OK(s, expr, what) \
    do { \
        if ((expr) != SQLITE_OK) { \
            int e_ = db_err(s, what); \
            q_done(st); \
            return e_; \
        } \
    } while (0)

/* Runs a statement that returns no rows (or whose rows we ignore); returns changed row count. */
static int q_exec(store *s, sqlite3_stmt *st, const char *what) {
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {}
    int r = rc == SQLITE_DONE ? sqlite3_changes(s->db) : db_err(s, what);
    q_done(st);
    return r;
}

static int tx_begin(store *s, const char *what) {
    int r = q_exec(s, q_get(s, Q_BEGIN), what);
    return r < 0 ? r : 0;
}
static int tx_commit(store *s, const char *what) {
    int r = q_exec(s, q_get(s, Q_COMMIT), what);
    return r < 0 ? r : 0;
}
/* Leaves the error detail of the failure that made us roll back. */
static void tx_rollback(store *s) {
    if (!sqlite3_get_autocommit(s->db)) {
        sqlite3_stmt *st = q_get(s, Q_ROLLBACK);
        sqlite3_step(st);
        q_done(st);
    }
}

static int exec_sql(store *s, const char *sql, const char *what) {
    char *msg = NULL;
    if (sqlite3_exec(s->db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        int e = err_set(GE_STORE, "store: %s: %s", what, msg ? msg : sqlite3_errmsg(s->db));
        sqlite3_free(msg);
        return e;
    }
    return 0;
}

static char *dup_col(sqlite3_stmt *st, int c) {
    if (sqlite3_column_type(st, c) == SQLITE_NULL) return NULL;
    const char *t = (const char *)sqlite3_column_text(st, c);
    return t ? strdup(t) : NULL;
}

static void copy_col(char *dst, size_t n, sqlite3_stmt *st, int c) {
    const char *t = (const char *)sqlite3_column_text(st, c);
    snprintf(dst, n, "%s", t ? t : "");
}

/* Fills *j from a row of JOB_COLS. */
static int job_from_row(sqlite3_stmt *st, store_job *j) {
    memset(j, 0, sizeof *j);
    copy_col(j->id, sizeof j->id, st, 0);
    copy_col(j->kind, sizeof j->kind, st, 1);
    int status = status_parse((const char *)sqlite3_column_text(st, 2));
    j->status = status < 0 ? JOB_FAILED : (store_status)status;
    j->payload = dup_col(st, 3);
    j->result = dup_col(st, 4);
    j->error = dup_col(st, 5);
    j->created_at = sqlite3_column_double(st, 6);
    j->started_at = sqlite3_column_double(st, 7);
    j->finished_at = sqlite3_column_double(st, 8);
    j->attempts = sqlite3_column_int(st, 9);
    j->policy_version = sqlite3_column_int64(st, 10);
    j->progress = sqlite3_column_double(st, 11);
    j->cancel_requested = sqlite3_column_int(st, 12);
    j->seq = sqlite3_column_int64(st, 13);
    if ((sqlite3_column_type(st, 3) != SQLITE_NULL && !j->payload) || (sqlite3_column_type(st, 4) != SQLITE_NULL && !j->result) ||
        (sqlite3_column_type(st, 5) != SQLITE_NULL && !j->error)) {
        store_job_clear(j);
        return err_set(GE_NOMEM, "store: out of memory copying job %s", j->id);
    }
    return 0;
}

void store_job_clear(store_job *j) {
    if (!j) return;
    free(j->payload);
    free(j->result);
    free(j->error);
    j->payload = j->result = j->error = NULL;
}

void store_jobs_free(store_job *jobs, int n) {
    for (int i = 0; jobs && i < n; i++) store_job_clear(&jobs[i]);
    free(jobs);
}

/* "j_" + 16 hex digits from the kernel's CSPRNG. */
static int new_job_id(char *out) {
    unsigned char b[8];
    size_t got = 0;
    while (got < sizeof b) {
        ssize_t r = getrandom(b + got, sizeof b - got, 0);
        if (r < 0) {
            if (errno == EINTR) continue;
            return err_set(GE_IO, "store: getrandom: %s", strerror(errno));
        }
        got += (size_t)r;
    }
    snprintf(out, 32, "j_%02x%02x%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]);
    return 0;
}

/* ---------------------------------------------------------------- open, migrate, close */

static int user_version(store *s, int *v) {
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(s->db, "PRAGMA user_version", -1, &st, NULL) != SQLITE_OK) return db_err(s, "reading user_version");
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) *v = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    return rc == SQLITE_ROW ? 0 : db_err(s, "reading user_version");
}

/* Applies migrations[current..] each in its own transaction together with its version bump;
 * re-reads the version under the write lock, so two processes opening at once migrate once. */
static int migrate(store *s) {
    for (;;) {
        int r = exec_sql(s, "BEGIN IMMEDIATE", "starting migration");
        if (r) return r;
        int v = 0;
        if ((r = user_version(s, &v))) goto fail;
        if (v >= N_MIGRATIONS) {
            if (v > N_MIGRATIONS) {
                r = err_set(GE_STORE,
                            "store: database schema version %d is newer than this "
                            "grpod knows (%d)",
                            v, N_MIGRATIONS);
                goto fail;
            }
            return exec_sql(s, "COMMIT", "ending migration");
        }
        char what[64], bump[64];
        snprintf(what, sizeof what, "migrating schema to version %d", v + 1);
        snprintf(bump, sizeof bump, "PRAGMA user_version = %d", v + 1);
        if ((r = exec_sql(s, migrations[v], what)) || (r = exec_sql(s, bump, what)) || (r = exec_sql(s, "COMMIT", what)))
            goto fail;
        continue;
    fail:
        sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
        return r;
    }
}

static int recover(store *s) {
    int r = tx_begin(s, "starting recovery");
    if (r) return r;
    sqlite3_stmt *st = q_get(s, Q_RECOVER_CANCELLED);
    BIND_OK(s, sqlite3_bind_double(st, 1, clock_wall_s()), "recovering jobs");
    if ((r = q_exec(s, st, "cancelling interrupted jobs")) < 0 ||
        (r = q_exec(s, q_get(s, Q_RECOVER), "requeueing interrupted jobs")) < 0 || (r = tx_commit(s, "committing recovery")) < 0) {
        tx_rollback(s);
        return r;
    }
    return 0;
}

/* Steps a bound statement over rows of JOB_COLS into a malloc'd array (store_jobs_free). */
static int collect_jobs(store *s, sqlite3_stmt *st, const char *what, store_job **jobs, int *n) {
    store_job *v = NULL;
    int cnt = 0, cap = 0, rc, r = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (cnt == cap) {
            int ncap = cap ? 2 * cap : 16;
            store_job *nv = realloc(v, (size_t)ncap * sizeof *nv);
            if (!nv) {
                r = err_set(GE_NOMEM, "store: out of memory %s", what);
                break;
            }
            v = nv;
            cap = ncap;
        }
        if ((r = job_from_row(st, &v[cnt]))) break;
        cnt++;
    }
    if (!r && rc != SQLITE_DONE) r = db_err(s, what);
    q_done(st);
    if (r) {
        store_jobs_free(v, cnt);
        return r;
    }
    *jobs = v;
    *n = cnt;
    return 0;
}

int store_open(const char *path, int recover_running, store **out) {
    *out = NULL;
    int r = fs_mkdirs(path);
    if (r) return r;
    char file[4200];
    snprintf(file, sizeof file, "%s/grpod.db", path);

    store *s = calloc(1, sizeof *s);
    if (!s) return err_set(GE_NOMEM, "store: out of memory");
    snprintf(s->file, sizeof s->file, "%s", file);
    /* created 0600 (jobs hold prompts and results); SQLite gives -wal and -shm the same mode */
    int fd = open(file, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) || ((sb.st_mode & 077) && fchmod(fd, 0600))) {
        r = err_set(GE_STORE, "store: opening %s: %s", file, strerror(errno));
        if (fd >= 0) close(fd);
        free(s);
        return r;
    }
    s->dev = sb.st_dev;
    s->ino = sb.st_ino;
    close(fd);
    if (sqlite3_open_v2(file, &s->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) != SQLITE_OK) {
        r = s->db ? err_set(GE_STORE, "store: opening %s: %s", file, sqlite3_errmsg(s->db))
                  : err_set(GE_NOMEM, "store: opening %s: out of memory", file);
        goto fail;
    }
    sqlite3_extended_result_codes(s->db, 1);
    if (sqlite3_busy_timeout(s->db, STORE_BUSY_TIMEOUT_MS) != SQLITE_OK) {
        r = db_err(s, "setting busy timeout");
        goto fail;
    }
    /* a new database gives deleted jobs' pages back to the file system (store_retain); one made
     * before keeps reusing them (the mode changes only with a full VACUUM) */
    if ((r = exec_sql(s, "PRAGMA auto_vacuum = INCREMENTAL", "setting incremental vacuum"))) goto fail;
    /* journal_mode answers with the mode it ended in: check it really is WAL */
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(s->db, "PRAGMA journal_mode = WAL", -1, &st, NULL) != SQLITE_OK) {
        r = db_err(s, "setting WAL mode");
        goto fail;
    }
    int rc = sqlite3_step(st);
    const char *mode = rc == SQLITE_ROW ? (const char *)sqlite3_column_text(st, 0) : NULL;
    int wal = mode && !strcmp(mode, "wal");
    sqlite3_finalize(st);
    if (!wal) {
        r = rc == SQLITE_ROW ? err_set(GE_STORE, "store: %s: WAL mode refused", file) : db_err(s, "setting WAL mode");
        goto fail;
    }
    if ((r = exec_sql(s, "PRAGMA synchronous = FULL", "setting synchronous=FULL")) || (r = migrate(s))) goto fail;
    for (int i = 0; i < Q_N; i++) {
        if (sqlite3_prepare_v3(s->db, sql_text[i], -1, SQLITE_PREPARE_PERSISTENT, &s->q[i], NULL) != SQLITE_OK) {
            r = db_err(s, "preparing statements");
            goto fail;
        }
    }
    if (recover_running && (r = recover(s))) goto fail;
    *out = s;
    return 0;
fail:
    store_close(s);
    return r;
}

void store_close(store *s) {
    if (!s) return;
    for (int i = 0; i < Q_N; i++) sqlite3_finalize(s->q[i]);
    sqlite3_close_v2(s->db);
    free(s);
}

/* ---------------------------------------------------------------- jobs */

int store_submit(store *s, const char *kind, const char *payload, int max_queued, char *id_out) {
    if (!kind || !kind[0] || strlen(kind) >= sizeof((store_job *)0)->kind)
        return err_set(GE_INVALID, "store: job kind '%.32s' is empty or too long", kind ? kind : "");
    int r = store_check_file(s);
    if (r) return r;
    r = tx_begin(s, "starting submit");
    if (r) return r;
    sqlite3_stmt *st;
    if (max_queued > 0) {
        st = q_get(s, Q_COUNT_QUEUED);
        int rc = sqlite3_step(st);
        long long n = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -1;
        q_done(st);
        if (n < 0) {
            r = db_err(s, "counting queued jobs");
            goto fail;
        }
        if (n >= max_queued) {
            r = err_set(GE_BUSY, "%lld jobs are queued (the limit is %d)", n, max_queued);
            goto fail;
        }
    }
    /* a collision of 64 random bits is next to impossible; retry rather than fail if it happens */
    for (int tries = 0;; tries++) {
        char id[32];
        if ((r = new_job_id(id))) goto fail;
        st = q_get(s, Q_INSERT);
        if (sqlite3_bind_text(st, 1, id, -1, SQLITE_TRANSIENT) != SQLITE_OK ||
            sqlite3_bind_text(st, 2, kind, -1, SQLITE_STATIC) != SQLITE_OK ||
            sqlite3_bind_text(st, 3, payload ? payload : "{}", -1, SQLITE_STATIC) != SQLITE_OK ||
            sqlite3_bind_double(st, 4, clock_wall_s()) != SQLITE_OK) {
            r = db_err(s, "binding a new job");
            q_done(st);
            goto fail;
        }
        int rc = sqlite3_step(st);
        q_done(st);
        if (rc == SQLITE_DONE) {
            memcpy(id_out, id, 32);
            break;
        }
        if (rc != SQLITE_CONSTRAINT_PRIMARYKEY || tries >= 3) {
            r = db_err(s, "inserting a new job");
            goto fail;
        }
    }
    if ((r = tx_commit(s, "committing a new job"))) goto fail;
    return 0;
fail:
    tx_rollback(s);
    return r;
}

int store_claim(store *s, store_job *j) {
    /* BEGIN IMMEDIATE takes the write lock first, so the select-oldest and the update see the
     * same snapshot and no other connection can claim the same row in between */
    int r = store_check_file(s);
    if (r) return r;
    r = tx_begin(s, "starting claim");
    if (r) return r;
    sqlite3_stmt *st = q_get(s, Q_CLAIM);
    if (sqlite3_bind_double(st, 1, clock_wall_s()) != SQLITE_OK) {
        r = db_err(s, "binding claim");
        q_done(st);
        goto fail;
    }
    int rc = sqlite3_step(st);
    int found = 0;
    if (rc == SQLITE_ROW) {
        if ((r = job_from_row(st, j))) {
            q_done(st);
            goto fail;
        }
        found = 1;
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {}
    }
    q_done(st);
    if (rc != SQLITE_DONE) {
        r = db_err(s, "claiming a job");
        if (found) store_job_clear(j);
        goto fail;
    }
    if ((r = tx_commit(s, "committing claim"))) {
        if (found) store_job_clear(j);
        goto fail;
    }
    return found;
fail:
    tx_rollback(s);
    return r;
}

/* After an update that changed no row: GE_NOT_FOUND or GE_CONFLICT naming the status. */
static int no_change_err(store *s, const char *id, const char *action) {
    sqlite3_stmt *st = q_get(s, Q_STATUS);
    BIND_OK(s, sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC), "reading job status");
    int rc = sqlite3_step(st);
    int r;
    if (rc == SQLITE_ROW)
        r = err_set(GE_CONFLICT, "cannot %s job %s: it is %s", action, id, (const char *)sqlite3_column_text(st, 0));
    else if (rc == SQLITE_DONE) r = err_set(GE_NOT_FOUND, "no job %s", id);
    else r = db_err(s, "reading job status");
    q_done(st);
    return r;
}

/* Runs an update keyed by id (?1); 0 when it changed the job, else the reason it did not. */
static int update_job(store *s, sqlite3_stmt *st, const char *id, const char *action) {
    int r = q_exec(s, st, action);
    if (r < 0) return r;
    return r == 0 ? no_change_err(s, id, action) : 0;
}

int store_mark_started(store *s, const char *id) {
    sqlite3_stmt *st = q_get(s, Q_STARTED);
    BIND_OK(s, sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC), "binding started");
    BIND_OK(s, sqlite3_bind_double(st, 2, clock_wall_s()), "binding started");
    return update_job(s, st, id, "mark started");
}

int store_finish(store *s, const char *id, const char *result, long long policy_version) {
    sqlite3_stmt *st = q_get(s, Q_FINISH);
    BIND_OK(s, sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC), "binding finish");
    BIND_OK(s, result ? sqlite3_bind_text(st, 2, result, -1, SQLITE_STATIC) : sqlite3_bind_null(st, 2), "binding finish");
    BIND_OK(s, sqlite3_bind_int64(st, 3, policy_version), "binding finish");
    BIND_OK(s, sqlite3_bind_double(st, 4, clock_wall_s()), "binding finish");
    return update_job(s, st, id, "finish");
}

int store_finish_update(store *s, const char *id, const char *result, long long version_before, long long version_after) {
    int r = store_check_file(s);
    if (r) return r;
    if ((r = tx_begin(s, "starting an update's finish"))) return r;
    if (version_after > version_before) {
        sqlite3_stmt *st = q_get(s, Q_MAX_UPDATE_VERSION);
        int rc = sqlite3_step(st);
        long long top = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -2;
        q_done(st);
        if (top == -2) {
            r = db_err(s, "reading the newest update's version");
            goto fail;
        }
        if (top >= version_after) {
            r = err_set(GE_CONFLICT, "update %s made policy_version %lld, but the store already holds an update that made %lld",
                        id, version_after, top);
            goto fail;
        }
    }
    if ((r = store_finish(s, id, result, version_after))) goto fail;
    if ((r = tx_commit(s, "committing an update's finish"))) goto fail;
    return 0;
fail:
    tx_rollback(s);
    return r;
}

int store_fail(store *s, const char *id, const char *error_json) {
    sqlite3_stmt *st = q_get(s, Q_FAIL);
    BIND_OK(s, sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC), "binding fail");
    BIND_OK(s, sqlite3_bind_text(st, 2, error_json ? error_json : "{}", -1, SQLITE_STATIC), "binding fail");
    BIND_OK(s, sqlite3_bind_double(st, 3, clock_wall_s()), "binding fail");
    return update_job(s, st, id, "fail");
}

int store_requeue_failed(store *s, const char *id) {
    sqlite3_stmt *st = q_get(s, Q_REQUEUE_FAILED);
    BIND_OK(s, sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC), "binding requeue");
    return update_job(s, st, id, "requeue");
}

int store_check_file(store *s) {
    struct stat sb;
    if (stat(s->file, &sb))
        return err_set(GE_UNAVAILABLE, "store: %s is gone (%s): it was deleted or moved while grpod ran", s->file, strerror(errno));
    if (sb.st_dev != s->dev || sb.st_ino != s->ino)
        return err_set(GE_UNAVAILABLE, "store: %s was replaced while grpod ran (another file is at its path)", s->file);
    return 0;
}

int store_updates_after(store *s, long long version, store_job **jobs, int *n) {
    *jobs = NULL;
    *n = 0;
    sqlite3_stmt *st = q_get(s, Q_UPDATES_AFTER);
    BIND_OK(s, sqlite3_bind_int64(st, 1, version), "binding updates after");
    return collect_jobs(s, st, "listing updates to replay", jobs, n);
}

int store_requeue(store *s, const char *id) {
    sqlite3_stmt *st = q_get(s, Q_REQUEUE);
    BIND_OK(s, sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC), "binding requeue");
    return update_job(s, st, id, "requeue");
}

int store_fail_exhausted(store *s, int max_attempts) {
    sqlite3_stmt *st = q_get(s, Q_FAIL_EXHAUSTED);
    BIND_OK(s, sqlite3_bind_int(st, 1, max_attempts > 0 ? max_attempts : 1), "binding fail exhausted");
    BIND_OK(s, sqlite3_bind_double(st, 2, clock_wall_s()), "binding fail exhausted");
    return q_exec(s, st, "failing jobs interrupted too often");
}

int store_progress(store *s, const char *id, double progress) {
    sqlite3_stmt *st = q_get(s, Q_PROGRESS);
    BIND_OK(s, sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC), "binding progress");
    BIND_OK(s, sqlite3_bind_double(st, 2, progress < 0 ? 0 : progress > 1 ? 1 : progress), "binding progress");
    return update_job(s, st, id, "set progress of");
}

int store_cancel(store *s, const char *id) {
    int r = tx_begin(s, "starting cancel");
    if (r) return r;
    sqlite3_stmt *st = q_get(s, Q_CANCEL_QUEUED);
    if (sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC) != SQLITE_OK || sqlite3_bind_double(st, 2, clock_wall_s()) != SQLITE_OK) {
        r = db_err(s, "binding cancel");
        q_done(st);
        goto fail;
    }
    if ((r = q_exec(s, st, "cancelling a queued job")) < 0) goto fail;
    if (r == 0) { /* not queued: flag it if running, else say why not */
        st = q_get(s, Q_FLAG_CANCEL);
        if (sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC) != SQLITE_OK) {
            r = db_err(s, "binding cancel");
            q_done(st);
            goto fail;
        }
        if ((r = q_exec(s, st, "flagging a running job for cancel")) < 0) goto fail;
        if (r == 0) {
            r = no_change_err(s, id, "cancel");
            goto fail;
        }
    }
    if ((r = tx_commit(s, "committing cancel"))) goto fail;
    return 0;
fail:
    tx_rollback(s);
    return r;
}

int store_cancel_requested(store *s, const char *id) {
    sqlite3_stmt *st = q_get(s, Q_CANCEL_REQ);
    BIND_OK(s, sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC), "binding cancel check");
    int rc = sqlite3_step(st);
    int r = rc == SQLITE_ROW ? (sqlite3_column_int(st, 0) != 0)
        : rc == SQLITE_DONE  ? err_set(GE_NOT_FOUND, "no job %s", id)
                             : db_err(s, "reading cancel flag");
    q_done(st);
    return r;
}

int store_mark_cancelled(store *s, const char *id) {
    sqlite3_stmt *st = q_get(s, Q_MARK_CANCELLED);
    BIND_OK(s, sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC), "binding mark cancelled");
    BIND_OK(s, sqlite3_bind_double(st, 2, clock_wall_s()), "binding mark cancelled");
    return update_job(s, st, id, "mark cancelled");
}

int store_get(store *s, const char *id, store_job *j) {
    sqlite3_stmt *st = q_get(s, Q_GET);
    BIND_OK(s, sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC), "binding get");
    int rc = sqlite3_step(st);
    int r = rc == SQLITE_ROW ? job_from_row(st, j)
        : rc == SQLITE_DONE  ? err_set(GE_NOT_FOUND, "no job %s", id)
                             : db_err(s, "reading a job");
    q_done(st);
    return r;
}

int store_list(store *s, const char *kind, const char *status, int limit, long long before, store_job **jobs, int *n) {
    *jobs = NULL;
    *n = 0;
    sqlite3_stmt *st = q_get(s, Q_LIST);
    BIND_OK(s, kind ? sqlite3_bind_text(st, 1, kind, -1, SQLITE_STATIC) : sqlite3_bind_null(st, 1), "binding list");
    BIND_OK(s, status ? sqlite3_bind_text(st, 2, status, -1, SQLITE_STATIC) : sqlite3_bind_null(st, 2), "binding list");
    BIND_OK(s, sqlite3_bind_int(st, 3, limit > 0 ? limit : -1), "binding list");
    BIND_OK(s, sqlite3_bind_int64(st, 4, before), "binding list");
    return collect_jobs(s, st, "listing jobs", jobs, n);
}

int store_counts(store *s, store_count_cb cb, void *ud) {
    sqlite3_stmt *st = q_get(s, Q_COUNTS);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW)
        cb(ud, (const char *)sqlite3_column_text(st, 0), (const char *)sqlite3_column_text(st, 1), sqlite3_column_int64(st, 2));
    int r = rc == SQLITE_DONE ? 0 : db_err(s, "counting jobs");
    q_done(st);
    return r;
}

long long store_queue_depth(store *s) {
    sqlite3_stmt *st = q_get(s, Q_COUNT_QUEUED);
    int rc = sqlite3_step(st);
    long long n = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : db_err(s, "counting queued jobs");
    q_done(st);
    return n;
}

/* ---------------------------------------------------------------- routes */

int store_routes_put(store *s, const char *id, const void *data, size_t n) {
    if (n > 0x7fffffff) return err_set(GE_TOO_LARGE, "store: routes of job %s are %zu bytes (at most 2 GiB)", id, n);
    sqlite3_stmt *st = q_get(s, Q_ROUTES_PUT);
    BIND_OK(s, sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC), "binding routes");
    BIND_OK(s, sqlite3_bind_blob(st, 2, data, (int)n, SQLITE_STATIC), "binding routes");
    int r = q_exec(s, st, "storing routes");
    return r < 0 ? r : 0;
}

int store_routes_get(store *s, const char *id, void **data, size_t *n) {
    *data = NULL;
    *n = 0;
    sqlite3_stmt *st = q_get(s, Q_ROUTES_GET);
    BIND_OK(s, sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC), "binding routes");
    int rc = sqlite3_step(st), r = 0;
    if (rc == SQLITE_ROW) {
        size_t len = (size_t)sqlite3_column_bytes(st, 0);
        const void *b = sqlite3_column_blob(st, 0);
        if (!(*data = malloc(len ? len : 1))) r = err_set(GE_NOMEM, "store: out of memory for the routes of job %s", id);
        else {
            if (len) memcpy(*data, b, len);
            *n = len;
        }
    } else {
        r = rc == SQLITE_DONE ? err_set(GE_NOT_FOUND, "no routes recorded for job %s", id) : db_err(s, "reading routes");
    }
    q_done(st);
    return r;
}

/* ---------------------------------------------------------------- checkpoints */

int store_checkpoint_add(store *s, const char *id, const char *path, long long policy_version) {
    if (strlen(id) >= sizeof((store_ckpt *)0)->id || strlen(path) >= sizeof((store_ckpt *)0)->path)
        return err_set(GE_INVALID, "store: checkpoint id or path too long");
    sqlite3_stmt *st = q_get(s, Q_CKPT_ADD);
    BIND_OK(s, sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC), "binding checkpoint");
    BIND_OK(s, sqlite3_bind_text(st, 2, path, -1, SQLITE_STATIC), "binding checkpoint");
    BIND_OK(s, sqlite3_bind_int64(st, 3, policy_version), "binding checkpoint");
    BIND_OK(s, sqlite3_bind_double(st, 4, clock_wall_s()), "binding checkpoint");
    int r = q_exec(s, st, "adding a checkpoint");
    return r < 0 ? r : 0;
}

int store_checkpoint_delete(store *s, const char *id) {
    sqlite3_stmt *st = q_get(s, Q_CKPT_DEL);
    BIND_OK(s, sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC), "binding checkpoint delete");
    int r = q_exec(s, st, "deleting a checkpoint");
    return r < 0 ? r : r == 0 ? err_set(GE_NOT_FOUND, "no checkpoint %s", id) : 0;
}

int store_prune_inputs(store *s, long long version) {
    sqlite3_stmt *st = q_get(s, Q_PRUNE_INPUTS);
    BIND_OK(s, sqlite3_bind_int64(st, 1, version), "binding prune inputs");
    return q_exec(s, st, "dropping the inputs of checkpointed updates");
}

int store_retain(store *s, long long keep) {
    sqlite3_stmt *st = q_get(s, Q_RETAIN);
    BIND_OK(s, sqlite3_bind_int64(st, 1, keep), "binding retention");
    int n = q_exec(s, st, "deleting finished jobs past retention");
    if (n > 0) sqlite3_exec(s->db, "PRAGMA incremental_vacuum", NULL, NULL, NULL); /* best effort */
    return n;
}

long long store_size_bytes(store *s) {
    sqlite3_stmt *st = q_get(s, Q_SIZE);
    long long n = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -1;
    sqlite3_reset(st);
    return n;
}

int store_checkpoint_list(store *s, store_ckpt **out, int *n) {
    *out = NULL;
    *n = 0;
    sqlite3_stmt *st = q_get(s, Q_CKPT_LIST);
    store_ckpt *v = NULL;
    int cnt = 0, cap = 0, rc, r = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (cnt == cap) {
            int ncap = cap ? 2 * cap : 8;
            store_ckpt *nv = realloc(v, (size_t)ncap * sizeof *nv);
            if (!nv) {
                r = err_set(GE_NOMEM, "store: out of memory listing checkpoints");
                break;
            }
            v = nv;
            cap = ncap;
        }
        store_ckpt *c = &v[cnt++];
        copy_col(c->id, sizeof c->id, st, 0);
        copy_col(c->path, sizeof c->path, st, 1);
        c->policy_version = sqlite3_column_int64(st, 2);
        c->created_at = sqlite3_column_double(st, 3);
    }
    if (!r && rc != SQLITE_DONE) r = db_err(s, "listing checkpoints");
    q_done(st);
    if (r) {
        free(v);
        return r;
    }
    *out = v;
    *n = cnt;
    return 0;
}

/* ---------------------------------------------------------------- history */

int store_history_add(store *s, const char *kind, long long policy_version, const char *stats) {
    sqlite3_stmt *st = q_get(s, Q_HIST_ADD);
    BIND_OK(s, sqlite3_bind_double(st, 1, clock_wall_s()), "binding history");
    BIND_OK(s, sqlite3_bind_text(st, 2, kind, -1, SQLITE_STATIC), "binding history");
    BIND_OK(s, sqlite3_bind_int64(st, 3, policy_version), "binding history");
    BIND_OK(s, sqlite3_bind_text(st, 4, stats, -1, SQLITE_STATIC), "binding history");
    int r = q_exec(s, st, "adding history");
    return r < 0 ? r : 0;
}

int store_history_list(store *s, long long after_id, int limit, store_history_cb cb, void *ud) {
    sqlite3_stmt *st = q_get(s, Q_HIST_LIST);
    BIND_OK(s, sqlite3_bind_int64(st, 1, after_id), "binding history");
    BIND_OK(s, sqlite3_bind_int(st, 2, limit), "binding history");
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW)
        cb(ud, sqlite3_column_int64(st, 0), sqlite3_column_double(st, 1), (const char *)sqlite3_column_text(st, 2),
           sqlite3_column_int64(st, 3), (const char *)sqlite3_column_text(st, 4));
    int r = rc == SQLITE_DONE ? 0 : db_err(s, "listing history");
    q_done(st);
    return r;
}
