/* test_host_pages.c — host_pages_map (engine/backend/host_pages.h), which the CUDA backend pins
 * for its host buffers: sizes from 1 byte to past a 2 MiB page boundary come back zeroed and
 * page-aligned, every byte writable, and distinct buffers never overlap. */
#include <stdint.h>

#include "engine/backend/host_pages.h"
#include "tests/unit/check.h"

TEST(test_zeroed_aligned_writable) {
    static const size_t sizes[] = {1, 4095, 4096, 4097, ((size_t)2 << 20) - 4096, (size_t)2 << 20, ((size_t)5 << 20) + 12345};
    enum { N = sizeof sizes / sizeof sizes[0] };
    unsigned char *p[N];
    for (int i = 0; i < N; i++) {
        p[i] = host_pages_map(sizes[i]);
        CHECK_MSG(p[i] != NULL, "host_pages_map(%zu) failed", sizes[i]);
        CHECK_EQ_INT((uintptr_t)p[i] % 4096, 0);
        for (size_t k = 0; k < sizes[i]; k++)
            if (p[i][k]) FAILF("buffer %d byte %zu is %d, not 0", i, k, p[i][k]);
        memset(p[i], 0x40 + i, sizes[i]);
    }
    /* every buffer still holds its own byte after all were written: no two overlap */
    for (int i = 0; i < N; i++)
        for (size_t k = 0; k < sizes[i]; k += 1 + sizes[i] / 997)
            if (p[i][k] != 0x40 + i) FAILF("buffer %d byte %zu is %d, not %d", i, k, p[i][k], 0x40 + i);
    for (int i = 0; i < N; i++) host_pages_unmap(p[i]);
    host_pages_unmap(NULL);
}

int main(void) {
    RUN(test_zeroed_aligned_writable);
    return CHECK_DONE();
}
