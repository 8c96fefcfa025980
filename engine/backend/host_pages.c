/* host_pages.c — see host_pages.h. */
#include "engine/backend/host_pages.h"

#include <stdint.h>
#include <sys/mman.h>

#include "common/err.h"

/* The mapping's length sits in its first page; the caller's bytes start one page in. */
enum { HDR = 4096 };
#define HUGE ((size_t)2 << 20)

void *host_pages_map(size_t bytes) {
    size_t len = (bytes + HDR + HUGE - 1) & ~(HUGE - 1);
    char *base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) {
        err_set(GE_NOMEM, "cannot map %.1f GiB of host memory", len / 1073741824.0);
        return NULL;
    }
#ifdef MADV_HUGEPAGE
    madvise(base, len, MADV_HUGEPAGE);
#endif
    /* one write a 4 KiB page makes it present (the kernel zeroes it), over every core */
    const long long pages = (long long)(len / 4096);
#pragma omp parallel for schedule(static, 512)
    for (long long i = 0; i < pages; i++) ((volatile char *)base)[i * 4096] = 0;
    *(size_t *)base = len;
    return base + HDR;
}

void host_pages_unmap(void *p) {
    if (!p) return;
    char *base = (char *)p - HDR;
    munmap(base, *(size_t *)base);
}
