/* fuzz_safetensors.c — libFuzzer target over the safetensors reader (engine/format/safetensors.c): the
 * bytes are a whole file (u64 header length, JSON header, data). Opening it either fails with
 * GE_FORMAT/GE_IO and a message, or yields tensors whose [off, end) tile the data buffer; each
 * is then converted to fp32. Never crash, overflow or read outside the file. The file lives in
 * a memfd, opened by its /proc path as the loader opens any file. */
#define _GNU_SOURCE
#include <assert.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/err.h"
#include "engine/format/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int fd = memfd_create("st", 0);
    if (fd < 0) return 0;
    if (size && write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return 0;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    st_set s = {0};
    int rc = st_open_file(&s, path);
    close(fd);
    if (rc) {
        assert(err_msg()[0]);
        st_close(&s);
        return 0;
    }
    for (int i = 0; i < s.n; i++) {
        const st_tensor *t = &s.t[i];
        assert(t->end >= t->off && t->end <= size);
        if (t->numel > (1 << 20) || t->ndim < 1) continue;
        float *f = malloc((size_t)(t->numel ? t->numel : 1) * sizeof *f);
        st_read_f32(t, f, t->ndim, t->shape);
        free(f);
    }
    st_close(&s);
    return 0;
}
