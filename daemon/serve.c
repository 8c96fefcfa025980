/* serve.c — `grpod serve`: options (flags > --config file > GRPOD_* environment > defaults),
 * start-up checks, and the libuv main loop that owns signals (SIGTERM/SIGINT drain, SIGHUP
 * reload), timers (long-poll deadlines, sd_notify STATUS and WATCHDOG) and the wake-ups from
 * the engine thread. Not here: HTTP (api/, http.h), the engine thread (daemon/worker.c). */
#include "daemon/serve.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <json-c/json.h>
#include <uv.h>

#include "api/http.h"
#include "common/err.h"
#include "common/log.h"
#include "daemon/cluster.h"
#include "daemon/follow.h"
#include "daemon/ranks.h"
#include "daemon/reserve.h"
#include "daemon/sdnotify.h"
#include "daemon/worker.h"
#include "engine/engine.h"
#include "engine/model/lora.h"
#include "store/store.h"

/* ---------------------------------------------------------------- options */

typedef struct {
    char model[1024], data_dir[1024], listen[256], backend[16], api_key_file[1024], log_level[16], config[1024];
    char allowed_hosts[1024], allowed_origins[1024];
    char optimizer_offload[16], optimizer_moments[8];
    int insecure_no_auth, checkpoint_on_exit, expert_parallel;
    long long max_body_bytes, max_n, max_tokens, max_queued_jobs, http_threads, engine_threads;
    long long kv_budget_mib;
    long long lora_rank, lora_alpha;
    char lora_targets[128], lora_init[1024];
    long long max_connections, max_connections_per_client, request_timeout;
    long long keep_checkpoints, retain_jobs;
    long long ranks;
    char gpus[512];
    long long followers, follower_timeout;
    char join[512], cluster_host[256];
    /* --gpus parsed (not options themselves): n_gpus devices in gpu_dev; -1 = all, until
     * check_ranks counts them at start */
    int gpu_dev[RANKS_MAX], n_gpus;
} serve_opts;

typedef enum { O_STR, O_INT, O_BOOL } opt_kind;
typedef struct {
    const char *name; /* flag without "--", config key, GRPOD_ + upper(name) */
    opt_kind kind;
    size_t off, size; /* field in serve_opts */
    long long lo, hi;
    int reloadable; /* applied again on SIGHUP */
    const char *dflt, *help;
} opt_def;

#define S_(f) offsetof(serve_opts, f), sizeof(((serve_opts *)0)->f)
static const opt_def opts[] = {
    {"config", O_STR, S_(config), 0, 0, 0, "", "FILE with `key = value` lines (keys are these flag names)"},
    {"model", O_STR, S_(model), 0, 0, 0, "", "Hugging Face model DIR (default: the embedded tiny model, created in the data dir)"},
    {"data-dir", O_STR, S_(data_dir), 0, 0, 0, "./grpod-data", "state DIR: grpod.db, checkpoints/, default-model/"},
    {"listen", O_STR, S_(listen), 0, 0, 0, "127.0.0.1:8780", "HOST:PORT to serve HTTP on ([::1]:PORT for IPv6)"},
    {"backend", O_STR, S_(backend), 0, 0, 0, "auto", "auto|cpu|cuda"},
    {"optimizer-offload", O_STR, S_(optimizer_offload), 0, 0, 0, "auto",
     "auto|on|off|FRACTION: fp32 master weights and AdamW moments in host memory (auto: when they would not leave a quarter of "
     "the GPU free; split with the GPU when the host cannot hold them; FRACTION: that part in host memory, one rank)"},
    {"optimizer-moments", O_STR, S_(optimizer_moments), 0, 0, 0, "fp32",
     "fp32|bf16: AdamW's m and v as bf16 in host memory (8 bytes of host state a parameter, not 12; the optimizer in host "
     "memory: --optimizer-offload auto means on)"},
    {"api-key-file", O_STR, S_(api_key_file), 0, 0, 0, "",
     "FILE holding the API key; /v1 requests then need Authorization: Bearer KEY"},
    {"allowed-hosts", O_STR, S_(allowed_hosts), 0, 0, 0, "",
     "Host header names accepted besides IP addresses and localhost (comma-separated; * = any): the names a proxy forwards"},
    {"allowed-origins", O_STR, S_(allowed_origins), 0, 0, 0,
     "", "Origins (https://app.example, comma-separated; * = any) whose pages may call the API; by default requests carrying Origin are refused"},
    {"insecure-no-auth", O_BOOL, S_(insecure_no_auth), 0, 1, 0, "false", "allow a non-loopback --listen without --api-key-file"},
    {"max-body-bytes", O_INT, S_(max_body_bytes), 1024, 1LL << 34, 1, "8388608", "largest request body"},
    {"max-n", O_INT, S_(max_n), 1, 1 << 20, 1, "64", "largest n (responses per group)"},
    {"max-tokens", O_INT, S_(max_tokens), 1, 1 << 24, 1, "4096", "largest sampling.max_tokens"},
    {"max-queued-jobs", O_INT, S_(max_queued_jobs), 0, 1 << 30, 1, "1000", "queued jobs before POSTs get 429 (0 = no limit)"},
    {"log-level", O_STR, S_(log_level), 0, 0, 1, "info", "debug|info|warn|error (JSON lines on stderr)"},
    {"max-connections", O_INT, S_(max_connections), 16, 1 << 20, 0, "2048",
     "open HTTP connections in all; when half of them wait for their request, the oldest waiting one is closed for each new one"},
    {"max-connections-per-client", O_INT, S_(max_connections_per_client), 1, 1 << 20, 0, "256",
     "open connections from one client address (its oldest waiting one is closed beyond that)"},
    {"request-timeout", O_INT, S_(request_timeout), 1, 3600, 0, "30",
     "seconds a connection gets to send a whole request (head and body), from its accept or its last reply"},
    {"http-threads", O_INT, S_(http_threads), 1, 256, 0, "4", "HTTP thread pool size"},
    {"engine-threads", O_INT, S_(engine_threads), 0, 4096, 0, "0",
     "CPU backend threads (0 = all cores, but one left free above 4; they wait passively unless OMP_WAIT_POLICY=active); with "
     "--ranks each rank gets an equal share"},
    {"ranks", O_INT, S_(ranks), 1, RANKS_MAX, 0, "1",
     "CPU backend: run N data-parallel ranks in this process, each with its own engine, sharing one communicator (the optimizer "
     "state sharded N ways); the CPU stand-in for --gpus that the multi-rank tests use"},
    {"gpus", O_STR, S_(gpus), 0, 0, 0, "",
     "CUDA devices to run on, one data-parallel rank each in this process: all, or indices like 0,1,2 (implies --backend cuda; "
     "the ranks share one NCCL communicator, the optimizer state sharded across them; empty = one rank on device 0)"},
    {"expert-parallel", O_BOOL, S_(expert_parallel), 0, 1, 0, "false",
     "with --ranks N, --gpus or --followers: a mixture-of-experts model's experts split over the ranks (each holds E/N of them "
     "and their training state; tokens travel to them), the rest sharded as data parallelism shards it; rollouts decode from "
     "a whole copy of the model each rank holds"},
    {"followers", O_INT, S_(followers), 0, RANKS_MAX - 1, 0, "0",
     "lead K followers (grpod serve --join) whose ranks join this process's in one communicator: the engines open once all K "
     "joined, and every update, logprobs and checkpoint runs on every rank (rollouts on this process's ranks only); 0 = no "
     "followers"},
    {"join", O_STR, S_(join), 0, 0, 0,
     "", "run as a follower of the leader at URL (http://HOST:PORT, its --api-key-file's key): its --ranks or --gpus join the leader's; serves no HTTP"},
    {"cluster-host", O_STR, S_(cluster_host), 0, 0, 0, "",
     "with --followers: the address of this host the followers' ranks connect to (cpu: the tcp communicator's); default: the "
     "--listen host, required when that is 0.0.0.0 or ::"},
    {"follower-timeout", O_INT, S_(follower_timeout), 1, 3600, 0, "10",
     "with --followers: seconds without a request from a follower (it beats every second) before it counts as lost"},
    {"kv-budget-mib", O_INT, S_(kv_budget_mib), 0, 1LL << 30, 0, "0",
     "rollout KV cache pool in MiB (0 = auto: half the free GPU memory net of training state on cuda, 2^18 rows on cpu)"},
    {"lora-rank", O_INT, S_(lora_rank), 0, 4096, 0, "0",
     "train LoRA adapters of this rank over the frozen base, which is also the reference (0 = full fine-tuning)"},
    {"lora-alpha", O_INT, S_(lora_alpha), 0, 1 << 20, 0, "0", "LoRA alpha: the adapters are scaled by alpha / rank (0 = 2 x rank)"},
    {"lora-targets", O_STR, S_(lora_targets), 0, 0, 0, "", "projections with adapters: q,k,v,o,gate,up,down (empty = all seven)"},
    {"lora-init", O_STR, S_(lora_init), 0, 0, 0, "",
     "PEFT adapter DIR to start from (adapter_config.json gives rank, alpha, targets)"},
    {"checkpoint-on-exit", O_BOOL, S_(checkpoint_on_exit), 0, 1, 0, "true",
     "save a checkpoint at shutdown when updates are unsaved"},
    {"keep-checkpoints", O_INT, S_(keep_checkpoints), 0, 1 << 30, 0, "0",
     "after each checkpoint delete all but the newest N (0 = keep all)"},
    {"retain-jobs", O_INT, S_(retain_jobs), 0, 1 << 30, 0, "10000",
     "keep the newest N finished jobs; older ones are deleted unless replay still needs them (0 = keep all)"},
};
#define N_OPTS ((int)(sizeof opts / sizeof opts[0]))

static void usage(FILE *f) {
    fprintf(f,
            "usage: grpod serve [--flag VALUE | --flag=VALUE]...\n\n"
            "Runs the grpod daemon: an HTTP+JSON API (see docs/api.md, GET /openapi.json) over a durable job\n"
            "queue and one engine thread. Settings come from flags, then the --config file, then GRPOD_*\n"
            "environment variables (GRPOD_ + the flag name in upper case with _ for -), then defaults.\n"
            "SIGHUP re-reads the config file and environment for the settings marked (reloadable).\n\n");
    for (int i = 0; i < N_OPTS; i++) {
        char env[64];
        snprintf(env, sizeof env, "GRPOD_");
        for (const char *p = opts[i].name; *p; p++) {
            size_t l = strlen(env);
            env[l] = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
            env[l + 1] = 0;
        }
        fprintf(f, "  --%-20s %s%s\n  %-22s   env %s%s%s%s\n", opts[i].name, opts[i].help,
                opts[i].reloadable ? " (reloadable)" : "", "", env, opts[i].dflt[0] ? ", default " : "", opts[i].dflt,
                opts[i].kind == O_BOOL ? " (flag alone = true)" : "");
    }
    fprintf(f, "  --%-20s this text\n", "help");
}

static int set_opt(serve_opts *o, const opt_def *d, const char *v, const char *src, char *why, size_t wl) {
    char *dst = (char *)o + d->off;
    if (d->kind == O_STR) {
        if (strlen(v) >= d->size) {
            snprintf(why, wl, "%s: --%s is too long", src, d->name);
            return -1;
        }
        memcpy(dst, v, strlen(v) + 1);
    } else if (d->kind == O_BOOL) {
        int b;
        if (!strcmp(v, "true") || !strcmp(v, "1") || !strcmp(v, "yes")) b = 1;
        else if (!strcmp(v, "false") || !strcmp(v, "0") || !strcmp(v, "no")) b = 0;
        else {
            snprintf(why, wl, "%s: --%s must be true or false, not '%s'", src, d->name, v);
            return -1;
        }
        *(int *)dst = b;
    } else {
        char *end;
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (errno || end == v || *end || x < d->lo || x > d->hi) {
            snprintf(why, wl, "%s: --%s must be an integer %lld..%lld, not '%s'", src, d->name, d->lo, d->hi, v);
            return -1;
        }
        *(long long *)dst = x;
    }
    return 0;
}

static const opt_def *find_opt(const char *name, size_t len) {
    for (int i = 0; i < N_OPTS; i++)
        if (strlen(opts[i].name) == len && !strncmp(opts[i].name, name, len)) return &opts[i];
    return NULL;
}

static char *trim(char *s) {
    while (isspace((unsigned char)*s)) s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1])) s[--n] = 0;
    return s;
}

static int apply_config_file(serve_opts *o, const char *path, char *why, size_t wl) {
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(why, wl, "--config %s: %s", path, strerror(errno));
        return -1;
    }
    char line[2048];
    int ln = 0, rc = 0;
    while (!rc && fgets(line, sizeof line, f)) {
        ln++;
        char *s = trim(line);
        if (!*s || *s == '#') continue;
        char *eq = strchr(s, '=');
        char src[1100];
        snprintf(src, sizeof src, "%s:%d", path, ln);
        if (!eq) {
            snprintf(why, wl, "%s: expected key = value", src);
            rc = -1;
            break;
        }
        *eq = 0;
        char *k = trim(s), *v = trim(eq + 1);
        const opt_def *d = find_opt(k, strlen(k));
        if (!d || !strcmp(k, "config")) {
            snprintf(why, wl, "%s: unknown key '%s'", src, k);
            rc = -1;
            break;
        }
        rc = set_opt(o, d, v, src, why, wl);
    }
    fclose(f);
    return rc;
}

/* --gpus: "" (not given: *n = 0), "all" (*n = -1: counted at start, check_ranks), or distinct
 * device indices "0,1,3" into dev. Syntax only: SIGHUP resolves the options again, and that must
 * not touch CUDA. */
static int parse_gpus(const char *s, int *dev, int *n, char *why, size_t wl) {
    *n = 0;
    if (!*s) return 0;
    if (!strcmp(s, "all")) {
        *n = -1;
        return 0;
    }
    for (const char *p = s;;) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        int digits = isdigit((unsigned char)p[0]) || (p[0] == '-' && isdigit((unsigned char)p[1]));
        if (!digits || errno || x > INT_MAX || (*end && *end != ',')) {
            snprintf(why, wl, "--gpus '%s': expected all or device indices like 0,1,2", s);
            return -1;
        }
        if (x < 0) {
            snprintf(why, wl, "--gpus '%s': device %ld is negative", s, x);
            return -1;
        }
        for (int i = 0; i < *n; i++)
            if (dev[i] == x) {
                snprintf(why, wl, "--gpus '%s': device %ld is listed twice", s, x);
                return -1;
            }
        if (*n == RANKS_MAX) {
            snprintf(why, wl, "--gpus '%s': at most %d devices", s, RANKS_MAX);
            return -1;
        }
        dev[(*n)++] = (int)x;
        if (!*end) return 0;
        p = end + 1;
    }
}

/* The rank options together: --gpus (cuda ranks) excludes --backend cpu and --ranks N > 1 and
 * makes auto cuda; --ranks N > 1 needs --backend cpu. */
static int check_rank_opts(serve_opts *o, char *why, size_t wl) {
    if (o->gpus[0]) {
        if (!strcmp(o->backend, "cpu")) {
            snprintf(why, wl, "--gpus needs the cuda backend, not --backend cpu (CPU ranks: --ranks N)");
            return -1;
        }
        if (o->ranks > 1) {
            snprintf(why, wl, "--gpus and --ranks %lld: --gpus runs one rank per device (--ranks is for CPU ranks)", o->ranks);
            return -1;
        }
        if (parse_gpus(o->gpus, o->gpu_dev, &o->n_gpus, why, wl)) return -1;
        snprintf(o->backend, sizeof o->backend, "cuda");
    }
    if (o->ranks > 1 && strcmp(o->backend, "cpu")) {
        snprintf(why, wl, "--ranks %lld needs --backend cpu (it runs CPU ranks in one process)", o->ranks);
        return -1;
    }
    if (o->expert_parallel && o->join[0]) { /* the leader decides for every rank of its world */
        snprintf(why, wl, "--expert-parallel is the leader's flag: a follower (--join) takes it from the world it joins");
        return -1;
    }
    if (o->join[0] && o->followers > 0) {
        snprintf(why, wl, "--join and --followers: a process is a follower or a leader, not both");
        return -1;
    }
    if (o->join[0] && strncmp(o->join, "http://", 7)) {
        snprintf(why, wl, "--join '%s': expected http://HOST:PORT of the leader", o->join);
        return -1;
    }
    if ((o->join[0] || o->followers > 0) && !strcmp(o->backend, "auto")) {
        snprintf(
            why, wl,
            "--%s needs --backend cpu, or cuda (--gpus): every process of a deployment must make the same kind of communicator",
            o->join[0] ? "join" : "followers");
        return -1;
    }
    return 0;
}

/* Resolves every option: defaults, then environment, then the config file, then flags. */
static int resolve_opts(int argc, char **argv, serve_opts *o, int *help, char *why, size_t wl) {
    memset(o, 0, sizeof *o);
    *help = 0;
    for (int i = 0; i < N_OPTS; i++) set_opt(o, &opts[i], opts[i].dflt, "default", why, wl);
    for (int i = 0; i < N_OPTS; i++) {
        char env[64] = "GRPOD_";
        for (const char *p = opts[i].name; *p; p++) {
            size_t l = strlen(env);
            env[l] = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
            env[l + 1] = 0;
        }
        const char *v = getenv(env);
        if (v && set_opt(o, &opts[i], v, env, why, wl)) return -1;
    }
    /* flags: first pass only to validate and find --config */
    serve_opts fl;
    memcpy(&fl, o, sizeof fl);
    const char *config = o->config[0] ? o->config : NULL;
    int nflags = 0;
    struct {
        const opt_def *d;
        const char *v;
    } flags[128];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            *help = 1;
            return 0;
        }
        if (strncmp(a, "--", 2)) {
            snprintf(why, wl, "unexpected argument '%s' (flags start with --)", a);
            return -1;
        }
        const char *eq = strchr(a + 2, '=');
        const opt_def *d = find_opt(a + 2, eq ? (size_t)(eq - a - 2) : strlen(a + 2));
        if (!d) {
            snprintf(why, wl, "unknown flag '%s' (see grpod serve --help)", a);
            return -1;
        }
        const char *v = eq ? eq + 1 : NULL;
        if (!v && d->kind == O_BOOL) v = "true";
        if (!v) {
            if (i + 1 >= argc) {
                snprintf(why, wl, "--%s needs a value", d->name);
                return -1;
            }
            v = argv[++i];
        }
        if (set_opt(&fl, d, v, "flag", why, wl)) return -1;
        if (nflags == 128) {
            snprintf(why, wl, "too many flags");
            return -1;
        }
        flags[nflags].d = d;
        flags[nflags++].v = v;
        if (d == &opts[0]) config = v;
    }
    if (config && *config) {
        char cfg[1024];
        snprintf(cfg, sizeof cfg, "%s", config);
        if (apply_config_file(o, cfg, why, wl)) return -1;
        snprintf(o->config, sizeof o->config, "%s", cfg);
    }
    for (int i = 0; i < nflags; i++) set_opt(o, flags[i].d, flags[i].v, "flag", why, wl);
    log_level lv;
    if (log_parse_level(o->log_level, &lv)) {
        snprintf(why, wl, "--log-level '%s' must be debug|info|warn|error", o->log_level);
        return -1;
    }
    if (strcmp(o->backend, "auto") && strcmp(o->backend, "cpu") && strcmp(o->backend, "cuda")) {
        snprintf(why, wl, "--backend '%s' must be auto|cpu|cuda", o->backend);
        return -1;
    }
    unsigned targets;
    if (o->lora_targets[0] && lora_parse_targets(o->lora_targets, &targets)) {
        snprintf(why, wl, "--lora-targets: %s", err_msg());
        return -1;
    }
    if (check_rank_opts(o, why, wl)) return -1;
    double frac;
    if (eng_offload_mode_check(o->optimizer_offload, &frac)) {
        snprintf(why, wl, "--optimizer-offload '%s' must be auto|on|off or a fraction in [0, 1] (of the state in host memory)",
                 o->optimizer_offload);
        return -1;
    }
    int m16;
    if (eng_moments_check(o->optimizer_moments, &m16)) {
        snprintf(why, wl, "--optimizer-moments '%s' must be fp32 or bf16", o->optimizer_moments);
        return -1;
    }
    return 0;
}

/* At start, once: the devices --gpus names against those this process can use (CUDA is asked
 * here, not in resolve_opts), and LoRA, which the engine trains on one rank only. */
static int check_ranks(serve_opts *o, char *why, size_t wl) {
    if (o->n_gpus) {
        int have = eng_device_count();
        if (have <= 0) {
            snprintf(why, wl, "--gpus: no CUDA device is usable");
            return -1;
        }
        if (o->n_gpus < 0) {
            o->n_gpus = have < RANKS_MAX ? have : RANKS_MAX;
            for (int i = 0; i < o->n_gpus; i++) o->gpu_dev[i] = i;
        }
        for (int i = 0; i < o->n_gpus; i++)
            if (o->gpu_dev[i] >= have) {
                snprintf(why, wl, "--gpus: device %d is not there (%d usable: 0..%d)", o->gpu_dev[i], have, have - 1);
                return -1;
            }
    }
    int W = o->n_gpus ? o->n_gpus : (int)o->ranks;
    if (o->followers > 0 || o->join[0]) W = 2; /* ranks in other processes: a communicator */
    if (W > 1 && (o->lora_rank > 0 || o->lora_init[0])) {
        snprintf(why, wl, "--lora-rank/--lora-init with %d ranks: LoRA trains on one rank only (not over a communicator)", W);
        return -1;
    }
    return 0;
}

static void limits_of(const serve_opts *o, api_limits *l) {
    api_limits_default(l);
    l->max_body_bytes = o->max_body_bytes;
    l->max_n = (int)o->max_n;
    l->max_tokens = (int)o->max_tokens;
    l->max_queued_jobs = (int)o->max_queued_jobs;
}

/* ---------------------------------------------------------------- the main loop */

typedef struct {
    int argc;
    char **argv;
    serve_opts o;
    uv_loop_t *loop;
    uv_signal_t sig_term, sig_int, sig_hup;
    uv_timer_t tick, watchdog;
    uv_async_t wake; /* from the engine thread: ready / failed / job done */
    uv_async_t restart; /* from the cluster: a follower is back after a loss */
    cluster *cl; /* --followers */
    api_server *api;
    worker *w;
    store *st; /* main-thread store handle (queue depth for STATUS) */
    int ready_sent, stopping;
    long long last_version, last_depth;
    int last_ready; /* worker_ready() at the last STATUS= */
    double watchdog_s;
} serve_state;

static void status_update(serve_state *s, int force) {
    long long v = worker_policy_version(s->w), d = store_queue_depth(s->st);
    int r = worker_ready(s->w);
    /* resend when readiness changes too, or STATUS would say "loading" until the queue moves */
    if (!force && v == s->last_version && d == s->last_depth && r == s->last_ready) return;
    s->last_ready = r;
    s->last_version = v;
    s->last_depth = d;
    sdn_notifyf("STATUS=policy_version=%lld queue=%lld%s", v, d < 0 ? 0 : d,
                worker_ready(s->w) == 1      ? ""
                    : worker_ready(s->w) < 0 ? " engine=failed"
                                             : " loading");
}

static void on_wake(uv_async_t *a) {
    serve_state *s = a->data;
    if (!s->ready_sent && worker_ready(s->w) == 1) {
        s->ready_sent = 1;
        sdn_notify("READY=1");
        log_event(LOG_INFO, "ready", "\"port\":%d", api_port(s->api));
    }
    status_update(s, 0);
}

static void on_tick(uv_timer_t *t) {
    serve_state *s = t->data;
    api_tick(s->api);
    cluster_tick(s->cl);
    status_update(s, 0);
}

/* WATCHDOG=1 only while the engine thread's heartbeat is recent: a wedged engine (a hung
 * kernel, a deadlock) stops the pings and systemd restarts grpod. While the model loads the
 * engine cannot beat; start-up is covered by systemd's TimeoutStartSec instead. */
static void on_watchdog(uv_timer_t *t) {
    serve_state *s = t->data;
    if (worker_ready(s->w) == 0 || worker_heartbeat_age(s->w) < s->watchdog_s) sdn_notify("WATCHDOG=1");
    else log_event(LOG_WARN, "watchdog_skipped", "\"heartbeat_age_s\":%.2f", worker_heartbeat_age(s->w));
}

static void close_cb(uv_handle_t *h) { (void)h; }

static void on_term(uv_signal_t *sig, int signum) {
    serve_state *s = sig->data;
    if (s->stopping) {
        log_event(LOG_WARN, "signal_again", "\"signal\":%d,\"note\":\"still draining the running job\"", signum);
        return;
    }
    s->stopping = 1;
    sdn_notify("STOPPING=1");
    log_event(LOG_INFO, "stopping", "\"signal\":%d", signum);
    if (s->cl) api_quiesce_work(s->api);
    else api_quiesce(s->api);
    worker_stop(s->w);
    uv_stop(s->loop); /* serve_main joins the engine thread (it finishes its job) */
}

#define API_KEY_FILE_MAX 512 /* the key and its NUL: api/http's compare buffer */
static int read_key_file(const char *path, char *key, size_t n, char *why, size_t wl);

static void on_hup(uv_signal_t *sig, int signum) {
    serve_state *s = sig->data;
    sdn_notify("RELOADING=1");
    serve_opts n;
    int help;
    char why[1200];
    if (resolve_opts(s->argc, s->argv, &n, &help, why, sizeof why)) {
        char esc[1300];
        log_event(LOG_ERROR, "reload_failed", "\"message\":%s", log_str(esc, sizeof esc, why));
    } else {
        log_level lv;
        log_parse_level(n.log_level, &lv);
        log_set_level(lv);
        api_limits l;
        limits_of(&n, &l);
        api_set_limits(s->api, &l);
        for (int i = 0; i < N_OPTS; i++)
            if (opts[i].reloadable) memcpy((char *)&s->o + opts[i].off, (char *)&n + opts[i].off, opts[i].size);
        if (s->o.api_key_file[0]) { /* a rotated key takes effect now; a bad file keeps the old */
            char key[API_KEY_FILE_MAX];
            if (read_key_file(s->o.api_key_file, key, sizeof key, why, sizeof why)) {
                char esc[1300];
                log_event(LOG_ERROR, "api_key_reload_failed", "\"message\":%s", log_str(esc, sizeof esc, why));
            } else {
                api_set_api_key(s->api, key);
                log_event(LOG_INFO, "api_key_reloaded", NULL);
            }
            memset(key, 0, sizeof key);
        }
        log_event(LOG_INFO, "reloaded",
                  "\"log_level\":\"%s\",\"max_n\":%lld,\"max_tokens\":%lld,\"max_queued_jobs\":%lld,\"max_body_bytes\":%lld",
                  n.log_level, n.max_n, n.max_tokens, n.max_queued_jobs, n.max_body_bytes);
    }
    sdn_notify("READY=1");
}

/* A follower joins after one was lost: stop, then start again as a new process image
 * (SERVE_REEXEC: crash-only, a new epoch, daemon/cluster.h). */
static void on_restart(uv_async_t *a) {
    serve_state *s = a->data;
    if (!s->stopping) on_term(&s->sig_term, SIGTERM);
}
static void on_cluster_restart(void *ud) { uv_async_send((uv_async_t *)ud); }

static void on_job_submitted(void *ud) { worker_wake((worker *)ud); }
static void on_worker_notify(void *ud) { uv_async_send((uv_async_t *)ud); }

static int read_key_file(const char *path, char *key, size_t n, char *why, size_t wl) {
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(why, wl, "--api-key-file %s: %s", path, strerror(errno));
        return -1;
    }
    char buf[1024] = "";
    if (!fgets(buf, sizeof buf, f)) buf[0] = 0;
    fclose(f);
    char *k = trim(buf);
    if (strlen(k) < 8 || strlen(k) >= n) {
        snprintf(why, wl, "--api-key-file %s: the key must be 8..%zu characters on the first line", path, n - 1);
        return -1;
    }
    snprintf(key, n, "%s", k);
    return 0;
}

/* One daemon per data directory: an exclusive flock on DATA/grpod.lock, held until exit (the
 * kernel drops it when the process dies, kill -9 included). The fd, or -1 with why. */
static int lock_data_dir(const char *dir, char *why, size_t wl) {
    char path[1100];
    snprintf(path, sizeof path, "%s/grpod.lock", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(why, wl, "cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    if (flock(fd, LOCK_EX | LOCK_NB)) {
        snprintf(why, wl,
                 "--data-dir %.400s is in use by another grpod (%.500s is locked%s); stop it first or use another --data-dir",
                 dir, path, errno == EWOULDBLOCK ? "" : ": cannot lock");
        close(fd);
        return -1;
    }
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) || pwrite(fd, pid, (size_t)n, 0) != n) { /* the pid is informational */
    }
    return fd;
}

/* The data directory made (0700; the umask makes the daemon's files 0600) and locked for this
 * process: the lock's fd, or -1 after saying why on stderr. */
static int claim_data_dir(const char *dir) {
    char why[1200];
    umask(077);
    if (mkdir(dir, 0700) && errno != EEXIST) {
        fprintf(stderr, "grpod serve: cannot create --data-dir %s: %s\n", dir, strerror(errno));
        return -1;
    }
    int fd = lock_data_dir(dir, why, sizeof why);
    if (fd < 0) fprintf(stderr, "grpod serve: %s\n", why);
    return fd;
}

/* A listening port is never shared (the listener sets no SO_REUSEPORT): 1 with why when
 * another process holds the address. */
static int port_in_use(const struct sockaddr_storage *ss, int sl, char *why, size_t wl) {
    int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    if (fd < 0) return 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one); /* as the listener: TIME_WAIT is no user */
    int busy = bind(fd, (const struct sockaddr *)ss, (socklen_t)sl) && errno == EADDRINUSE;
    close(fd);
    if (busy)
        snprintf(why, wl,
                 "cannot listen: the address is in use by another process (another grpod?); stop it or pick another --listen");
    return busy;
}

/* --listen's host when it names one address (not 0.0.0.0, ::, or empty): 0, else -1. */
static int listen_host(const char *listen, char *out, size_t n) {
    const char *h = listen, *e = strrchr(listen, ':');
    if (!e) return -1;
    if (*h == '[') {
        h++;
        if (e > h && e[-1] == ']') e--;
    }
    size_t l = (size_t)(e - h);
    if (!l || l >= n) return -1;
    memcpy(out, h, l);
    out[l] = 0;
    return strcmp(out, "0.0.0.0") && strcmp(out, "::") ? 0 : -1;
}

/* --join: a follower (daemon/follow.h); the data dir is locked as a daemon's. */
static int serve_follow(const serve_opts *o, const char *key) {
    json_c_set_serialization_double_format("%.9g", JSON_C_OPTION_GLOBAL);
    sdn_init();
    int lock_fd = claim_data_dir(o->data_dir);
    if (lock_fd < 0) return 1;
    follow_config fc = {.url = o->join,
                        .api_key = key,
                        .data_dir = o->data_dir,
                        .model_dir = o->model,
                        .backend = o->backend,
                        .optimizer_offload = o->optimizer_offload,
                        .moments_bf16 = !strcmp(o->optimizer_moments, "bf16"),
                        .ranks = o->n_gpus ? o->n_gpus : (int)o->ranks,
                        .devices = o->n_gpus ? o->gpu_dev : NULL,
                        .n_threads = (int)o->engine_threads,
                        .kv_budget_mib = o->kv_budget_mib};
    int rc = follow_main(&fc);
    close(lock_fd);
    return rc;
}

/* The checks before anything opens: the options (*help: --help), the log level, the listen
 * address and its authentication, the API key (key: API_KEY_FILE_MAX). 0, or the exit status 2
 * with the reason on stderr. */
static int serve_check(serve_state *s, int *help, char *key, struct sockaddr_storage *ss, int *sl, int *loopback) {
    char why[1200];
    if (resolve_opts(s->argc, s->argv, &s->o, help, why, sizeof why) || (!*help && check_ranks(&s->o, why, sizeof why))) {
        fprintf(stderr, "grpod serve: %s\n", why);
        return 2;
    }
    if (*help) return 0;
    log_level lv;
    log_parse_level(s->o.log_level, &lv);
    log_set_level(lv);
    if (api_parse_listen(s->o.listen, ss, sl, loopback)) {
        fprintf(stderr, "grpod serve: %s\n", err_msg());
        return 2;
    }
    if (!*loopback && !s->o.api_key_file[0] && !s->o.insecure_no_auth) {
        fprintf(stderr,
                "grpod serve: refusing to listen on %s (not loopback) without authentication.\n"
                "  Fix: put a secret in a file and pass --api-key-file FILE (clients then send\n"
                "  Authorization: Bearer <key>), or listen on 127.0.0.1, or pass --insecure-no-auth\n"
                "  if something in front of grpod authenticates.\n",
                s->o.listen);
        return 2;
    }
    if (s->o.api_key_file[0] && read_key_file(s->o.api_key_file, key, API_KEY_FILE_MAX, why, sizeof why)) {
        fprintf(stderr, "grpod serve: %s\n", why);
        return 2;
    }
    return 0;
}

/* The data directory claimed (*lock_fd, the lock held until exit), the port checked, and the
 * job store opened with recovery (jobs a crash left 'running' go back to the queue before
 * anything serves). 0, or the exit status 1 with the reason on stderr. */
static int open_data_dir(serve_state *s, const struct sockaddr_storage *ss, int sl, int *lock_fd) {
    char why[1200], resc[700];
    *lock_fd = claim_data_dir(s->o.data_dir); /* the database, checkpoints and directories: 0600 / 0700 */
    if (*lock_fd < 0) return 1;
    if (port_in_use(ss, sl, why, sizeof why)) {
        fprintf(stderr, "grpod serve: %s\n", why);
        close(*lock_fd);
        return 1;
    }
    /* a disk that filled while grpod was down: the reserve gives the store room to open */
    if (reserve_keep(s->o.data_dir))
        log_event(LOG_WARN, "disk_reserve_missing", "\"message\":%s", log_str(resc, sizeof resc, err_msg()));
    int src = store_open(s->o.data_dir, 1, &s->st);
    if (src && reserve_release(s->o.data_dir)) {
        log_event(LOG_WARN, "disk_reserve_released", "\"bytes\":%d,\"message\":%s", RESERVE_BYTES,
                  log_str(resc, sizeof resc, err_msg()));
        src = store_open(s->o.data_dir, 1, &s->st);
    }
    if (src) {
        fprintf(stderr, "grpod serve: %s\n", err_msg());
        close(*lock_fd);
        return 1;
    }
    int exhausted = store_fail_exhausted(s->st, STORE_MAX_ATTEMPTS);
    if (exhausted > 0) log_event(LOG_WARN, "jobs_failed_after_crashes", "\"count\":%d", exhausted);
    log_event(LOG_INFO, "starting", "\"listen\":\"%s\",\"data_dir\":\"%s\",\"model\":\"%s\",\"backend\":\"%s\",\"queued\":%lld",
              s->o.listen, s->o.data_dir, s->o.model[0] ? s->o.model : "(default)", s->o.backend, store_queue_depth(s->st));
    return 0;
}

/* The HTTP server's and the engine thread's configurations from the options. */
static void configs_of(serve_state *s, const char *key, api_config *ac, worker_config *wc) {
    *ac = (api_config){.listen = s->o.listen,
                       .data_dir = s->o.data_dir,
                       .api_key = key[0] ? key : NULL,
                       .allowed_hosts = s->o.allowed_hosts,
                       .allowed_origins = s->o.allowed_origins,
                       .threads = (int)s->o.http_threads,
                       .max_wait_s = 60,
                       .max_connections = (int)s->o.max_connections,
                       .max_per_client = (int)s->o.max_connections_per_client,
                       .request_timeout_s = (double)s->o.request_timeout};
    limits_of(&s->o, &ac->limits);
    *wc = (worker_config){.data_dir = s->o.data_dir,
                          .model_dir = s->o.model,
                          .backend = s->o.backend,
                          .optimizer_offload = s->o.optimizer_offload,
                          .moments_bf16 = !strcmp(s->o.optimizer_moments, "bf16"),
                          .expert_parallel = s->o.expert_parallel,
                          .n_threads = (int)s->o.engine_threads,
                          .ranks = s->o.n_gpus ? s->o.n_gpus : (int)s->o.ranks,
                          .devices = s->o.n_gpus ? s->o.gpu_dev : NULL,
                          .checkpoint_on_exit = s->o.checkpoint_on_exit,
                          .kv_budget_mib = s->o.kv_budget_mib,
                          .lora_rank = (int)s->o.lora_rank,
                          .lora_alpha = (float)s->o.lora_alpha,
                          .lora_targets = s->o.lora_targets,
                          .lora_init = s->o.lora_init,
                          .keep_checkpoints = s->o.keep_checkpoints,
                          .retain_jobs = s->o.retain_jobs,
                          .notify = on_worker_notify,
                          .ud = &s->wake};
}

/* The loop's signals (SIGTERM/SIGINT drain, SIGHUP reload) and timers (the 200 ms tick, the
 * systemd watchdog when it asks for one); unwatch closes them. */
static void watch(serve_state *s) {
    uv_signal_init(s->loop, &s->sig_term);
    s->sig_term.data = s;
    uv_signal_start(&s->sig_term, on_term, SIGTERM);
    uv_signal_init(s->loop, &s->sig_int);
    s->sig_int.data = s;
    uv_signal_start(&s->sig_int, on_term, SIGINT);
    uv_signal_init(s->loop, &s->sig_hup);
    s->sig_hup.data = s;
    uv_signal_start(&s->sig_hup, on_hup, SIGHUP);
    uv_timer_init(s->loop, &s->tick);
    s->tick.data = s;
    uv_timer_start(&s->tick, on_tick, 200, 200);
    unsigned long long wd = sdn_watchdog_usec();
    uv_timer_init(s->loop, &s->watchdog);
    s->watchdog.data = s;
    if (wd) {
        s->watchdog_s = (double)wd / 1e6;
        uv_timer_start(&s->watchdog, on_watchdog, wd / 2000 ? wd / 2000 : 1, wd / 2000 ? wd / 2000 : 1);
    }
}
static void unwatch(serve_state *s) {
    uv_handle_t *h[] = {(uv_handle_t *)&s->sig_term, (uv_handle_t *)&s->sig_int, (uv_handle_t *)&s->sig_hup,
                        (uv_handle_t *)&s->tick, (uv_handle_t *)&s->watchdog};
    for (size_t i = 0; i < sizeof h / sizeof h[0]; i++) uv_close(h[i], close_cb);
}

int serve_main(int argc, char **argv) {
    serve_state s = {.argc = argc, .argv = argv, .last_version = -2, .last_depth = -2};
    char key[API_KEY_FILE_MAX] = "", esc[1300];
    struct sockaddr_storage ss;
    int help = 0, sl, loopback, lock_fd, rc = serve_check(&s, &help, key, &ss, &sl, &loopback);
    if (rc) return rc;
    if (help) {
        usage(stdout);
        return 0;
    }
    if (s.o.join[0]) return serve_follow(&s.o, key);
    char cluster_host[256] = "";
    if (s.o.followers > 0) {
        if (s.o.cluster_host[0]) snprintf(cluster_host, sizeof cluster_host, "%s", s.o.cluster_host);
        else if (listen_host(s.o.listen, cluster_host, sizeof cluster_host)) {
            fprintf(stderr,
                    "grpod serve: --followers with --listen %s: pass --cluster-host, the address of this host the "
                    "followers' ranks connect to\n",
                    s.o.listen);
            return 2;
        }
    }
    if (!loopback && !key[0])
        log_event(LOG_WARN, "insecure_no_auth",
                  "\"listen\":\"%s\",\"note\":\"serving a non-loopback address without an API key\"", s.o.listen);
    json_c_set_serialization_double_format("%.9g", JSON_C_OPTION_GLOBAL);
    sdn_init();
    if (sdn_init_note()[0]) log_event(LOG_WARN, "sd_notify", "\"note\":%s", log_str(esc, sizeof esc, sdn_init_note()));

    if ((rc = open_data_dir(&s, &ss, sl, &lock_fd))) return rc;
    rc = 1;

    s.loop = uv_default_loop();
    uv_async_init(s.loop, &s.wake, on_wake);
    s.wake.data = &s;
    api_config ac;
    worker_config wc;
    configs_of(&s, key, &ac, &wc);
    if (api_start(&ac, &s.api)) {
        log_event(LOG_ERROR, "listen_failed", "\"message\":%s", log_str(esc, sizeof esc, err_msg()));
        goto fail_api;
    }
    log_event(LOG_INFO, "listening", "\"listen\":\"%s\",\"port\":%d", s.o.listen, api_port(s.api));
    wc.api = s.api;
    uv_async_init(s.loop, &s.restart, on_restart);
    s.restart.data = &s;
    if (s.o.followers > 0) {
        cluster_config cc = {.followers = (int)s.o.followers,
                             .host = cluster_host,
                             .lost_s = (double)s.o.follower_timeout,
                             .api = s.api,
                             .on_restart = on_cluster_restart,
                             .ud = &s.restart};
        if (cluster_open(&cc, &s.cl)) {
            log_event(LOG_ERROR, "cluster_failed", "\"message\":%s", log_str(esc, sizeof esc, err_msg()));
            goto fail_worker;
        }
        api_set_cluster_hook(s.api, cluster_hook, s.cl);
        wc.cluster = s.cl;
    }
    if (worker_start(&wc, &s.w)) {
        log_event(LOG_ERROR, "engine_thread_failed", "\"message\":%s", log_str(esc, sizeof esc, err_msg()));
        goto fail_worker;
    }
    /* the api's submit hook needs the worker, which needs the api: wire it now */
    api_set_submit_hook(s.api, on_job_submitted, s.w);

    watch(&s);
    status_update(&s, 1);
    uv_run(s.loop, UV_RUN_DEFAULT);

    /* drain: the engine thread finishes (or never started) its job, then everything closes;
     * the loop keeps turning meanwhile, so a second SIGTERM is logged (on_term) */
    while (!worker_finished(s.w)) uv_run(s.loop, UV_RUN_ONCE);
    worker_join(s.w);
    s.w = NULL;
    rc = !s.cl || !cluster_lost(s.cl) ? 0 : cluster_restart_wanted(s.cl) ? SERVE_REEXEC : CLUSTER_EXIT_RESTART;
    unwatch(&s);
fail_worker:
    uv_close((uv_handle_t *)&s.restart, close_cb);
    api_set_cluster_hook(s.api, NULL, NULL);
    api_stop(s.api);
    cluster_close(s.cl);
fail_api:
    uv_close((uv_handle_t *)&s.wake, close_cb);
    uv_run(s.loop, UV_RUN_NOWAIT);
    uv_loop_close(s.loop);
    store_close(s.st);
    close(lock_fd);
    log_event(LOG_INFO, "stopped", "\"status\":%d", rc);
    return rc;
}
