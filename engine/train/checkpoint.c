/* checkpoint.c — saving, verifying and resuming the policy's checkpoints (eng_checkpoint_*).
 *
 * A checkpoint is an HF directory (config.json, model.safetensors, tokenizer files) plus the
 * training state (optimizer.safetensors: AdamW m and v; grpod_state.json: policy_version and
 * optimizer step) and manifest.json: every other file's size and 64-bit hash. Crash safety:
 *   write everything to DIR.tmp ─► fsync each file ─► manifest.json (fsynced) ─► fsync DIR.tmp
 *   ─► rename DIR.tmp → DIR ─► fsync the parent directory.
 * A crash before the rename leaves only DIR.tmp (removed at the next start); after it, DIR is
 * complete on disk. eng_checkpoint_verify re-reads every file against the manifest before a
 * resume, so a directory damaged later (a torn copy, a bad disk, an edit) is refused, not
 * loaded. A failed save (disk full) removes DIR.tmp and leaves nothing half-written.
 * Idempotent: a save that finds DIR already there keeps it when it verifies and holds this
 * policy_version and optimizer step (the same save, run again after a crash between its rename
 * and its caller's record of it); otherwise it writes DIR.tmp whole, removes DIR, and renames.
 *
 * Not here: which checkpoint to resume (the daemon's worker walks the store's index). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/engine_internal.h"
#include "common/err.h"
#include "engine/format/json.h"
#include "engine/model/lora.h"
#include "engine/format/safetensors.h"
#include "engine/train/state.h"

#define MANIFEST "manifest.json"
#define STATE "grpod_state.json"

/* ---------------------------------------------------------------- files */

static int fsync_path(const char *path, int dir) {
    int fd = open(path, dir ? O_RDONLY | O_DIRECTORY : O_RDONLY);
    if (fd < 0) return err_set(GE_IO, "%s: cannot open to sync: %s", path, strerror(errno));
    int rc = fsync(fd) ? err_set(GE_IO, "%s: fsync: %s", path, strerror(errno)) : 0;
    close(fd);
    return rc;
}

/* Size and hash of a file's bytes: 8-byte words folded with a multiply-xorshift (not
 * cryptographic: it catches torn, truncated and flipped data, not an adversary). */
static int hash_file(const char *path, long long *bytes, uint64_t *hash) {
    FILE *f = fopen(path, "rb");
    if (!f) return err_set(GE_IO, "%s: %s", path, strerror(errno));
    unsigned char *buf = malloc(1 << 20);
    if (!buf) {
        fclose(f);
        return err_set(GE_NOMEM, "checkpoint: out of memory");
    }
    uint64_t h = 0x9e3779b97f4a7c15ULL;
    long long total = 0;
    size_t k;
    while ((k = fread(buf, 1, 1 << 20, f)) > 0) {
        size_t i = 0;
        for (; i + 8 <= k; i += 8) {
            uint64_t w;
            memcpy(&w, buf + i, 8);
            h = (h ^ w) * 0xff51afd7ed558ccdULL;
            h ^= h >> 32;
        }
        for (; i < k; i++) h = (h ^ buf[i]) * 0x100000001b3ULL;
        total += (long long)k;
    }
    int bad = ferror(f);
    fclose(f);
    free(buf);
    if (bad) return err_set(GE_IO, "%s: read error", path);
    *bytes = total;
    *hash = h ^ (uint64_t)total;
    return 0;
}

static int copy_file(const char *src, const char *dst) {
    FILE *in = fopen(src, "rb");
    if (!in) return 0; /* optional files */
    FILE *o = fopen(dst, "wb");
    if (!o) {
        fclose(in);
        return err_set(GE_IO, "%s: cannot create: %s", dst, strerror(errno));
    }
    char buf[65536];
    size_t k;
    int ok = 1;
    while ((k = fread(buf, 1, sizeof buf, in)) > 0) ok &= fwrite(buf, 1, k, o) == k;
    fclose(in);
    if (fclose(o) || !ok) return err_set(GE_IO, "%s: write failed: %s", dst, strerror(errno));
    return 0;
}

static int write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) return err_set(GE_IO, "%s: cannot create: %s", path, strerror(errno));
    int ok = fputs(text, f) >= 0;
    if (fclose(f) || !ok) return err_set(GE_IO, "%s: write failed: %s", path, strerror(errno));
    return 0;
}

int eng_remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? 0 : err_set(GE_IO, "%s: %s", dir, strerror(errno));
    struct dirent *de;
    char p[PATH_MAX + 300];
    int rc = 0;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        struct stat sb;
        if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode)) {
            if (!rc) rc = eng_remove_tree(p);
        } else if (unlink(p) && !rc) rc = err_set(GE_IO, "%s: %s", p, strerror(errno));
    }
    closedir(d);
    if (rmdir(dir) && !rc) rc = err_set(GE_IO, "%s: %s", dir, strerror(errno));
    return rc;
}

/* ---------------------------------------------------------------- manifest */

/* Fsyncs every file of dir and writes manifest.json (fsynced) listing them. */
static int write_manifest(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return err_set(GE_IO, "%s: %s", dir, strerror(errno));
    char path[PATH_MAX + 300], *text = NULL;
    size_t tl = 0;
    FILE *m = open_memstream(&text, &tl);
    int rc = m ? 0 : err_set(GE_NOMEM, "checkpoint: out of memory");
    if (!rc) fprintf(m, "{\"format\": \"grpod-manifest-v1\", \"files\": {");
    struct dirent *de;
    int n = 0;
    while (!rc && (de = readdir(d))) {
        if (de->d_name[0] == '.' || !strcmp(de->d_name, MANIFEST)) continue;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        long long bytes;
        uint64_t h;
        if ((rc = fsync_path(path, 0)) || (rc = hash_file(path, &bytes, &h))) break;
        fprintf(m, "%s\n  ", n++ ? "," : "");
        js_write_str(m, de->d_name, strlen(de->d_name));
        fprintf(m, ": {\"bytes\": %lld, \"hash\": \"%016llx\"}", bytes, (unsigned long long)h);
    }
    closedir(d);
    if (m) {
        fprintf(m, "}}\n");
        fclose(m);
    }
    snprintf(path, sizeof path, "%s/%s", dir, MANIFEST);
    if (!rc) rc = write_text(path, text);
    if (!rc) rc = fsync_path(path, 0);
    free(text);
    return rc;
}

/* Every file of dir against its manifest; need_state: the manifest must list grpod_state.json. */
static int verify_dir(const char *dir, int need_state) {
    char path[PATH_MAX + 300];
    snprintf(path, sizeof path, "%s/%s", dir, MANIFEST);
    js_doc *doc;
    const js *r;
    int rc = js_parse_file(path, &doc, &r);
    if (rc) return err_set(GE_FORMAT, "%s: no readable manifest (%s)", dir, err_msg());
    const js *files = js_get(r, "files");
    int has_state = 0, has_model = 0;
    if (!files || files->type != JS_OBJ) rc = err_set(GE_FORMAT, "%s: manifest without files", dir);
    for (int i = 0; !rc && i < files->n; i++) {
        const char *name = files->keys[i], *want = js_get_str(&files->items[i], "hash");
        long long want_bytes = (long long)js_get_num(&files->items[i], "bytes", -1), bytes;
        uint64_t h;
        char hex[24];
        if (strchr(name, '/') || !want) {
            rc = err_set(GE_FORMAT, "%s: bad manifest entry %s", dir, name);
            break;
        }
        snprintf(path, sizeof path, "%s/%s", dir, name);
        if ((rc = hash_file(path, &bytes, &h))) {
            rc = err_set(GE_FORMAT, "%s: %s", dir, err_msg());
            break;
        }
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
        if (bytes != want_bytes) rc = err_set(GE_FORMAT, "%s: %lld bytes, the manifest says %lld", path, bytes, want_bytes);
        else if (strcmp(hex, want))
            rc = err_set(GE_FORMAT, "%s: contents differ from the manifest (hash %s, expected %s)", path, hex, want);
        has_state |= !strcmp(name, STATE);
        has_model |= !strcmp(name, "model.safetensors") || !strcmp(name, "adapter_model.safetensors");
    }
    if (!rc && ((need_state && !has_state) || !has_model))
        rc = err_set(GE_FORMAT, "%s: the manifest lacks %s", dir, has_model ? STATE : "model.safetensors");
    js_doc_free(doc);
    return rc;
}

int eng_checkpoint_verify(const char *dir) { return verify_dir(dir, 1); }

/* What a checkpoint holds, decided once: the full weights and state (no LoRA), the adapters in
 * PEFT's files and their state (LoRA), or on request with LoRA an export, an HF directory of the
 * base with the adapters merged in. An export has no training state: its files alone say
 * whether it is whole. */
typedef enum { CKPT_FULL, CKPT_ADAPTERS, CKPT_EXPORT } ckpt_form;
static ckpt_form form_of(const eng *e, int merged) { return !e->m.lora_r ? CKPT_FULL : merged ? CKPT_EXPORT : CKPT_ADAPTERS; }

/* policy_version and optimizer step of dir's grpod_state.json (-1 where absent); GE_FORMAT, naming
 * the file, when it cannot be read. */
static int read_state(const char *dir, char *path, size_t cap, long long *v, long long *step) {
    snprintf(path, cap, "%s/%s", dir, STATE);
    js_doc *doc;
    const js *r;
    if (js_parse_file(path, &doc, &r)) return err_set(GE_FORMAT, "%s: %s", path, err_msg());
    double dv = js_get_num(r, "policy_version", -1), ds = js_get_num(r, "optimizer_step", -1);
    js_doc_free(doc);
    *v = dv < 0 ? -1 : (long long)dv;
    *step = ds < 0 ? -1 : (long long)ds;
    return 0;
}

/* dir is whole and, unless an export, holds version v at optimizer step step. */
static int matches_state(const char *dir, int export, long long v, long long step) {
    int rc = verify_dir(dir, !export);
    if (rc || export) return rc;
    char path[PATH_MAX + 64];
    long long dv, dstep;
    if ((rc = read_state(dir, path, sizeof path, &dv, &dstep))) return rc;
    if (dv != v || dstep != step)
        return err_set(GE_CONFLICT, "%s holds policy_version %lld, optimizer step %lld, not %lld, %lld", dir, dv, dstep, v, step);
    return 0;
}

int eng_checkpoint_matches(eng *e, const char *dir, int merged) {
    return matches_state(dir, form_of(e, merged) == CKPT_EXPORT, (long long)e->policy_version, e->opt_step);
}

/* ---------------------------------------------------------------- save */

/* What a save writes, taken from the engine at one moment (eng_checkpoint_capture): the whole
 * master (the adapters with LoRA), m and v as host fp32 (state_whole), for an export the
 * policy's merged weights, and the version they are. */
struct eng_ckpt {
    eng *e; /* its model description, model_dir and LoRA layout: fixed for the engine's life */
    ckpt_form form;
    int owned[3];
    float *st[3];
    float *merged_w; /* an export's merged weights (owned), else NULL */
    long long version, step;
};

/* Everything but the manifest into tmp: the weights (with LoRA the adapter in PEFT's layout,
 * or merged into an HF directory), then the training state unless a merged export. Host memory
 * and files only: no backend call. */
static int save_files(const eng_ckpt *c, const char *tmp) {
    const eng *e = c->e;
    char path[PATH_MAX + 64], src[PATH_MAX + 64];
    /* with expert parallelism the files hold the model without it (every expert; ep.c) */
    const model *fm = eng_ckpt_model(e);
    size_t nt = (size_t)state_whole_n(e);
    int rc = 0;
    if (c->form == CKPT_ADAPTERS) {
        rc = lora_save_peft(&e->m, tmp, c->st[0], e->model_dir);
    } else {
        /* the policy's weights: the master, or with LoRA the base with the adapters merged in */
        rc = config_write(tmp, &fm->cfg);
        if (!rc) rc = model_save_host(fm, tmp, c->merged_w ? c->merged_w : c->st[0], 0);
        static const char *const tok_files[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"};
        for (int i = 0; i < 3 && !rc; i++) {
            snprintf(src, sizeof src, "%s/%s", e->model_dir, tok_files[i]);
            snprintf(path, sizeof path, "%s/%s", tmp, tok_files[i]);
            rc = copy_file(src, path);
        }
    }
    if (!rc && c->st[1]) {
        st_out o[2] = {{.name = "adam_m", .data = c->st[1], .ndim = 1, .shape = {(long long)nt}},
                       {.name = "adam_v", .data = c->st[2], .ndim = 1, .shape = {(long long)nt}}};
        snprintf(path, sizeof path, "%s/optimizer.safetensors", tmp);
        rc = st_write(path, o, 2, ST_F32);
    }
    if (!rc && c->form != CKPT_EXPORT) {
        char state[256];
        snprintf(state, sizeof state, "{\"format\": \"grpod-checkpoint-v1\", \"policy_version\": %lld, \"optimizer_step\": %lld}\n",
                 c->version, c->step);
        snprintf(path, sizeof path, "%s/%s", tmp, STATE);
        rc = write_text(path, state);
    }
    return rc;
}

int eng_checkpoint_save(eng *e, const char *dir) { return eng_checkpoint_save_ex(e, dir, 0); }

/* The directory, written whole or not at all. */
static int save_dir(const eng_ckpt *c, const char *dir) {
    char tmp[PATH_MAX], parent[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s.tmp", dir);
    snprintf(parent, sizeof parent, "%s", dir);
    char *slash = strrchr(parent, '/');
    if (slash) *slash = 0;
    else snprintf(parent, sizeof parent, ".");
    struct stat sb;
    int replace = stat(dir, &sb) == 0;
    if (replace && matches_state(dir, c->form == CKPT_EXPORT, c->version, c->step) == 0) return 0; /* this save's own result */
    eng_remove_tree(tmp); /* a leftover of a crash during the same save */
    int rc = mkdir(tmp, 0700) ? err_set(GE_IO, "%s: cannot create: %s", tmp, strerror(errno)) : 0;
    if (!rc) rc = save_files(c, tmp);
    if (!rc) rc = write_manifest(tmp);
    if (!rc) rc = fsync_path(tmp, 1);
    /* a crash between the removal and the rename leaves DIR.tmp, removed at the next start, and
     * no DIR: the save runs again */
    if (!rc && replace) rc = eng_remove_tree(dir);
    if (!rc && rename(tmp, dir)) rc = err_set(GE_IO, "%s: cannot rename to %s: %s", tmp, dir, strerror(errno));
    if (!rc) rc = fsync_path(parent, 1);
    if (rc) {
        int code = err_code();
        char msg[600];
        snprintf(msg, sizeof msg, "%s", err_msg());
        eng_remove_tree(tmp); /* disk full: give the space back, leave nothing half-written */
        rc = err_set(code, "checkpoint not saved: %s", msg);
    }
    return rc;
}

/* Every rank calls it with a comm: the state is gathered whole into rank 0's host memory
 * (state.h) and the ranks agree on the result; rank 0 gets the capture. */
int eng_checkpoint_capture(eng *e, int merged, eng_ckpt **out) {
    *out = NULL;
    eng_ckpt *c = calloc(1, sizeof *c);
    int rc = c ? 0 : err_set(GE_NOMEM, "checkpoint: out of memory");
    if (!rc) {
        c->e = e;
        c->form = form_of(e, merged);
        c->version = (long long)e->policy_version;
        c->step = e->opt_step;
        rc = state_whole(e, e->adam_m && c->form != CKPT_EXPORT, c->st, c->owned);
    }
    if (!rc && e->rank == 0 && c->form == CKPT_EXPORT) {
        /* the base with the adapters merged in, read off the device now */
        if (!(c->merged_w = malloc((size_t)e->m.n_elems * 4))) rc = err_set(GE_NOMEM, "checkpoint: out of memory");
        if (!rc && !(rc = e->be->act_to_f32(e->be, c->merged_w, e->w_act, (size_t)e->m.n_elems)))
            lora_merge_host(&e->m, c->merged_w, c->st[0]);
    }
    rc = dp_agree(e, rc);
    if (rc || e->rank != 0) {
        eng_checkpoint_capture_free(c);
        return rc;
    }
    *out = c;
    return 0;
}

int eng_checkpoint_write(const eng_ckpt *c, const char *dir) { return save_dir(c, dir); }

void eng_checkpoint_capture_free(eng_ckpt *c) {
    if (!c) return;
    state_whole_free(c->st, c->owned);
    free(c->merged_w);
    free(c);
}

/* A capture and its write at once; every rank returns rank 0's write result. */
int eng_checkpoint_save_ex(eng *e, const char *dir, int merged) {
    eng_ckpt *c;
    int rc = eng_checkpoint_capture(e, merged, &c);
    if (rc) return rc; /* agreed already */
    if (c) rc = eng_checkpoint_write(c, dir);
    eng_checkpoint_capture_free(c);
    return dp_agree(e, rc);
}

/* ---------------------------------------------------------------- resume */

/* Training state of a checkpoint into e (weights are loaded by eng_open): policy_version and
 * optimizer step from grpod_state.json (required: a missing or unreadable one is an error,
 * never version 0), AdamW moments from optimizer.safetensors (absent: a fresh optimizer). */
int eng_checkpoint_load_state(eng *e, const char *dir) {
    char path[PATH_MAX + 64];
    long long v, step;
    int rc = read_state(dir, path, sizeof path, &v, &step);
    if (rc) return err_set(GE_FORMAT, "checkpoint %s: %s", dir, err_msg());
    if (v < 0 || step < 0) return err_set(GE_FORMAT, "%s: no policy_version or optimizer_step", path);
    e->policy_version = v;
    e->opt_step = (int)step;
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    if (access(path, R_OK)) return 0;
    st_set s = {0};
    if ((rc = st_open_file(&s, path))) return rc;
    float *buf[2];
    int owned[2];
    if ((rc = state_moments_in(e, buf, owned))) {
        st_close(&s);
        return rc;
    }
    const char *names[2] = {"adam_m", "adam_v"};
    /* with expert parallelism the file holds every expert (ep_full's layout): this rank's part */
    long long dims[1] = {state_whole_n(e)};
    float *whole = e->ep_full ? malloc((size_t)dims[0] * 4) : NULL;
    if (e->ep_full && !whole) rc = err_set(GE_NOMEM, "checkpoint: out of memory (%lld MiB)", dims[0] * 4 >> 20);
    for (int i = 0; i < 2 && !rc; i++) {
        const st_tensor *t = st_find(&s, names[i]);
        rc = t ? st_read_f32(t, whole ? whole : buf[i], 1, dims) : err_set(GE_FORMAT, "%s: no tensor %s", path, names[i]);
        if (!rc && whole) ep_slice(e, whole, buf[i]);
    }
    free(whole);
    int src = state_set_moments(e, buf, owned);
    st_close(&s);
    return rc ? rc : src;
}
