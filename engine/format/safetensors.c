/* safetensors.c — see safetensors.h. Format: u64 little-endian N, N bytes of JSON header
 * {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
 * then the data buffer; offsets are relative to the buffer. */
#include "engine/format/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/bf16.h"
#include "common/err.h"
#include "engine/format/json.h"

float f16_to_f32(unsigned short h) {
    unsigned s = (h >> 15) & 1, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    float v;
    if (e == 0) v = ldexpf((float)m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = ldexpf((float)(m | 0x400), (int)e - 25);
    return s ? -v : v;
}

static int dtype_of(const char *s, st_dtype *d, int *size) {
    static const struct {
        const char *n;
        st_dtype d;
        int size;
    } tab[] = {
        {"F32", ST_F32, 4},       {"F16", ST_F16, 2},       {"BF16", ST_BF16, 2}, {"F64", ST_OTHER, 8}, {"I64", ST_OTHER, 8},
        {"I32", ST_OTHER, 4},     {"I16", ST_OTHER, 2},     {"I8", ST_OTHER, 1},  {"U8", ST_OTHER, 1},  {"BOOL", ST_OTHER, 1},
        {"F8_E4M3", ST_OTHER, 1}, {"F8_E5M2", ST_OTHER, 1}, {"U16", ST_OTHER, 2}, {"U32", ST_OTHER, 4}, {"U64", ST_OTHER, 8},
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (!strcmp(s, tab[i].n)) {
            *d = tab[i].d;
            *size = tab[i].size;
            return 0;
        }
    return -1;
}

static int by_offset(const void *a, const void *b) {
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    return x->off < y->off ? -1 : x->off > y->off ? 1 : (x->end > y->end) - (x->end < y->end);
}

/* The data buffer as the safetensors format defines it: the file's tensors, ordered by offset,
 * tile it exactly — no overlap (two tensors sharing bytes), no hole, nothing after the last. */
static int check_layout(const st_set *s, int first, const char *path, size_t dsize) {
    int n = s->n - first;
    const st_tensor **v = malloc((size_t)(n ? n : 1) * sizeof *v);
    if (!v) return err_set(GE_NOMEM, "%s: out of memory", path);
    for (int i = 0; i < n; i++) v[i] = &s->t[first + i];
    qsort(v, (size_t)n, sizeof *v, by_offset);
    size_t at = 0;
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        if (v[i]->off != at)
            rc = err_set(GE_FORMAT, "%s: tensor %.128s starts at byte %zu of the data buffer, expected %zu (%s)", path,
                         v[i]->name, v[i]->off, at, v[i]->off < at ? "overlaps the one before" : "a hole before it");
        at = v[i]->end;
    }
    if (!rc && at != dsize)
        rc = err_set(GE_FORMAT, "%s: the tensors cover %zu bytes of the %zu-byte data buffer", path, at, dsize);
    free(v);
    return rc;
}

int st_open_file(st_set *s, const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return err_set(GE_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat stt;
    if (fstat(fd, &stt)) {
        close(fd);
        return err_set(GE_IO, "%s: cannot stat", path);
    }
    size_t size = (size_t)stt.st_size;
    if (size < 8) {
        close(fd);
        return err_set(GE_FORMAT, "%s: truncated: %zu bytes, no header length", path, size);
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return err_set(GE_IO, "%s: cannot mmap: %s", path, strerror(errno));
    const unsigned char *b = map;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | b[i];
    if (hlen > size - 8 || hlen > (100u << 20)) {
        munmap(map, size);
        return err_set(GE_FORMAT, "%s: header length %llu exceeds the file size %zu (truncated or not safetensors)", path,
                       (unsigned long long)hlen, size);
    }
    js_doc *doc;
    const js *root;
    if (js_parse((const char *)b + 8, hlen, &doc, &root)) {
        char why[512];
        snprintf(why, sizeof why, "%s", err_msg());
        munmap(map, size);
        return err_set(GE_FORMAT, "%s: header is not valid JSON (%s)", path, why);
    }
    int rc = 0;
    size_t dsize = size - 8 - hlen;
    const unsigned char *data = b + 8 + hlen;
    if (root->type != JS_OBJ) {
        rc = err_set(GE_FORMAT, "%s: header is not a JSON object", path);
        goto out;
    }
    char **paths = realloc(s->paths, (size_t)(s->nfiles + 1) * sizeof *paths);
    void **maps = realloc(s->maps, (size_t)(s->nfiles + 1) * sizeof *maps);
    size_t *sizes = realloc(s->sizes, (size_t)(s->nfiles + 1) * sizeof *sizes);
    st_tensor *t = realloc(s->t, (size_t)(s->n + root->n) * sizeof *t);
    if (paths) s->paths = paths;
    if (maps) s->maps = maps;
    if (sizes) s->sizes = sizes;
    if (t) s->t = t;
    if (!paths || !maps || !sizes || !t) {
        rc = err_set(GE_NOMEM, "%s: out of memory", path);
        goto out;
    }
    char *pathcopy = strdup(path);
    s->paths[s->nfiles] = pathcopy;
    s->maps[s->nfiles] = map;
    s->sizes[s->nfiles] = size;
    s->nfiles++;
    map = NULL; /* owned by the set now */
    int first = s->n;
    for (int i = 0; i < root->n; i++) {
        const char *name = root->keys[i];
        const js *e = &root->items[i];
        if (!strcmp(name, "__metadata__")) continue;
        const char *dt = js_get_str(e, "dtype");
        const js *shape = js_get(e, "shape"), *offs = js_get(e, "data_offsets");
        if (!dt || !shape || shape->type != JS_ARR || !offs || offs->type != JS_ARR || offs->n != 2) {
            rc = err_set(GE_FORMAT, "%s: tensor %.128s: header entry needs dtype, shape and data_offsets", path, name);
            goto out;
        }
        st_tensor *x = &s->t[s->n];
        memset(x, 0, sizeof *x);
        int esize;
        if (dtype_of(dt, &x->dtype, &esize)) {
            rc = err_set(GE_FORMAT, "%s: tensor %.128s: unknown dtype \"%.16s\"", path, name, dt);
            goto out;
        }
        snprintf(x->dtype_name, sizeof x->dtype_name, "%s", dt);
        if (shape->n > 8) {
            rc = err_set(GE_FORMAT, "%s: tensor %.128s: %d dimensions", path, name, shape->n);
            goto out;
        }
        x->ndim = shape->n;
        x->numel = 1;
        for (int d = 0; d < shape->n; d++) {
            double v = js_num(&shape->items[d], -1);
            if (!(v >= 0 && v <= 1e12) || v != floor(v)) {
                rc = err_set(GE_FORMAT, "%s: tensor %.128s: bad shape", path, name);
                goto out;
            }
            x->shape[d] = (long long)v;
            if (__builtin_mul_overflow(x->numel, x->shape[d], &x->numel) || x->numel > (long long)dsize) {
                rc = err_set(GE_FORMAT, "%s: tensor %.128s: shape holds more elements than the file", path, name);
                goto out;
            }
        }
        double b0 = js_num(&offs->items[0], -1), b1 = js_num(&offs->items[1], -1);
        if (!(b0 >= 0 && b1 >= b0 && b1 <= (double)dsize)) {
            rc = err_set(GE_FORMAT, "%s: tensor %.128s: data_offsets [%.0f, %.0f] outside the %zu-byte data buffer", path, name,
                         b0, b1, dsize);
            goto out;
        }
        if (b0 != floor(b0) || b1 != floor(b1)) {
            rc = err_set(GE_FORMAT, "%s: tensor %.128s: data_offsets [%g, %g] are not whole numbers", path, name, b0, b1);
            goto out;
        }
        x->off = (size_t)b0;
        x->end = (size_t)b1;
        if (x->end - x->off != (size_t)x->numel * (size_t)esize) {
            rc = err_set(GE_FORMAT, "%s: tensor %.128s: %zu bytes for %lld elements of %s", path, name, x->end - x->off, x->numel,
                         dt);
            goto out;
        }
        x->name = strdup(name);
        x->data = data + (size_t)b0;
        x->file = pathcopy;
        s->n++;
    }
    rc = check_layout(s, first, path, dsize);
out:
    js_doc_free(doc);
    if (map) munmap(map, size);
    return rc;
}

int st_open_dir(const char *dir, st_set *s) {
    memset(s, 0, sizeof *s);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (access(path, R_OK) == 0) {
        js_doc *doc;
        const js *root;
        int rc = js_parse_file(path, &doc, &root);
        if (rc) return rc;
        const js *wm = js_get(root, "weight_map");
        if (!wm || wm->type != JS_OBJ) {
            js_doc_free(doc);
            return err_set(GE_FORMAT, "%s: no weight_map object", path);
        }
        /* Open each distinct shard once, in order of first mention. */
        for (int i = 0; i < wm->n && !rc; i++) {
            const char *f = js_str(&wm->items[i]);
            if (!f || strchr(f, '/')) {
                rc = err_set(GE_FORMAT, "%s: bad shard name for %s", path, wm->keys[i]);
                break;
            }
            int seen = 0;
            for (int j = 0; j < i && !seen; j++) seen = !strcmp(js_str(&wm->items[j]), f);
            if (seen) continue;
            char sp[PATH_MAX];
            snprintf(sp, sizeof sp, "%s/%s", dir, f);
            rc = st_open_file(s, sp);
        }
        /* Every tensor the index names must be in the shard it names. */
        for (int i = 0; i < wm->n && !rc; i++)
            if (!st_find(s, wm->keys[i]))
                rc = err_set(GE_FORMAT, "%s: tensor %s listed in the index is in no shard", path, wm->keys[i]);
        js_doc_free(doc);
        if (rc) st_close(s);
        return rc;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int rc = st_open_file(s, path);
    if (rc) st_close(s);
    return rc;
}

void st_close(st_set *s) {
    for (int i = 0; i < s->n; i++) free(s->t[i].name);
    for (int i = 0; i < s->nfiles; i++) {
        munmap(s->maps[i], s->sizes[i]);
        free(s->paths[i]);
    }
    free(s->t);
    free(s->paths);
    free(s->maps);
    free(s->sizes);
    memset(s, 0, sizeof *s);
}

const st_tensor *st_find(const st_set *s, const char *name) {
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->t[i].name, name)) return &s->t[i];
    return NULL;
}

int st_check_shape(const st_tensor *t, int ndim, const long long *dims) {
    int ok = t->ndim == ndim;
    for (int d = 0; ok && d < ndim; d++) ok = t->shape[d] == dims[d];
    if (!ok) {
        char want[128] = "", got[128] = "";
        for (int d = 0; d < ndim; d++) snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", d ? "," : "", dims[d]);
        for (int d = 0; d < t->ndim; d++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? "," : "", t->shape[d]);
        return err_set(GE_FORMAT, "%s: tensor %s has shape (%s), expected (%s)", t->file, t->name, got, want);
    }
    return 0;
}

int st_read_f32(const st_tensor *t, float *dst, int ndim, const long long *dims) {
    int rc = st_check_shape(t, ndim, dims);
    if (rc) return rc;
    const unsigned char *src = t->data;
    switch (t->dtype) {
    case ST_F32: memcpy(dst, src, (size_t)t->numel * 4); break;
    /* elementwise, over the OpenMP threads: an 8B checkpoint is 8 G values */
    case ST_BF16:
#pragma omp parallel for schedule(static)
        for (long long i = 0; i < t->numel; i++) {
            unsigned short h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = f32_from_bf16(h);
        }
        break;
    case ST_F16:
#pragma omp parallel for schedule(static)
        for (long long i = 0; i < t->numel; i++) {
            unsigned short h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = f16_to_f32(h);
        }
        break;
    default:
        return err_set(GE_UNSUPPORTED, "%s: tensor %s has dtype %s; only F32, F16 and BF16 weights are supported", t->file,
                       t->name, t->dtype_name);
    }
    return 0;
}

int st_write(const char *path, const st_out *t, int n, st_dtype dtype) {
    int esize = dtype == ST_F32 ? 4 : 2;
    size_t cap = 256 + (size_t)n * 256, len = 0, off = 0;
    char *h = malloc(cap);
    if (!h) return err_set(GE_NOMEM, "%s: out of memory", path);
    len += (size_t)snprintf(h + len, cap - len, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < n; i++) {
        long long numel = 1;
        for (int d = 0; d < t[i].ndim; d++) numel *= t[i].shape[d];
        len += (size_t)snprintf(h + len, cap - len, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t[i].name,
                                dtype == ST_F32 ? "F32" : "BF16");
        for (int d = 0; d < t[i].ndim; d++) len += (size_t)snprintf(h + len, cap - len, "%s%lld", d ? "," : "", t[i].shape[d]);
        len += (size_t)snprintf(h + len, cap - len, "],\"data_offsets\":[%zu,%zu]}", off, off + (size_t)numel * esize);
        off += (size_t)numel * esize;
    }
    len += (size_t)snprintf(h + len, cap - len, "}");
    while (len % 8) h[len++] = ' ';
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(h);
        return err_set(GE_IO, "%s: cannot create: %s", path, strerror(errno));
    }
    unsigned char lb[8];
    for (int i = 0; i < 8; i++) lb[i] = (unsigned char)((uint64_t)len >> (8 * i));
    int ok = fwrite(lb, 1, 8, f) == 8 && fwrite(h, 1, len, f) == len;
    free(h);
    unsigned short *buf = dtype == ST_F32 ? NULL : malloc(1 << 16);
    for (int i = 0; ok && i < n; i++) {
        long long numel = 1;
        for (int d = 0; d < t[i].ndim; d++) numel *= t[i].shape[d];
        if (dtype == ST_F32) {
            ok = fwrite(t[i].data, 4, (size_t)numel, f) == (size_t)numel;
            continue;
        }
        for (long long j = 0; ok && j < numel; j += 32768) {
            long long k = numel - j < 32768 ? numel - j : 32768;
            for (long long q = 0; q < k; q++) buf[q] = bf16_from_f32(t[i].data[j + q]);
            ok = fwrite(buf, 2, (size_t)k, f) == (size_t)k;
        }
    }
    free(buf);
    if (fflush(f) || fsync(fileno(f))) ok = 0;
    if (fclose(f)) ok = 0;
    return ok ? 0 : err_set(GE_IO, "%s: write failed: %s", path, strerror(errno));
}
