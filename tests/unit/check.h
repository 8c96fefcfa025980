/* check.h — the unit-test harness: one binary per tests/unit/test_*.c.
 *
 * Each TEST(name) function runs in order from main (RUN(name)); each prints one line
 * "PASS name" or "FAIL name: why" that tests/run.sh counts. CHECK* macros record a failure and
 * return from the test. Tolerance checks print both numbers, so a failure says how far off. */
#ifndef GRPOD_CHECK_H
#define GRPOD_CHECK_H
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* TEST_TMP: the folder for a test's scratch files, BUILD/tmp (the Makefile passes it), so two
 * checkouts running their tests on one machine at once never share a file; made at start. */
#ifndef TEST_TMP
#define TEST_TMP "/tmp"
#endif
__attribute__((constructor)) static void check_tmp_dir_(void) { mkdir(TEST_TMP, 0755); }

static int check_failed_ = 0, check_cur_failed_ = 0;

#define TEST(name) static void name(void)
#define RUN(name) \
    do { \
        check_cur_failed_ = 0; \
        name(); \
        if (!check_cur_failed_) printf("PASS %s\n", #name); \
        else check_failed_++; \
        fflush(stdout); \
    } while (0)
#define CHECK_DONE() (check_failed_ ? 1 : 0)

#define FAILF(...) \
    do { \
        printf("FAIL %s: ", __func__); \
        printf(__VA_ARGS__); \
        printf(" (%s:%d)\n", __FILE__, __LINE__); \
        check_cur_failed_ = 1; \
        return; \
    } while (0)
#define CHECK(c) \
    do { \
        if (!(c)) FAILF("%s", #c); \
    } while (0)
#define CHECK_MSG(c, ...) \
    do { \
        if (!(c)) FAILF(__VA_ARGS__); \
    } while (0)
#define CHECK_EQ_INT(a, b) \
    do { \
        long long a_ = (a), b_ = (b); \
        if (a_ != b_) FAILF("%s == %lld, expected %lld", #a, a_, b_); \
    } while (0)
#define CHECK_STR(a, b) \
    do { \
        const char *a_ = (a), *b_ = (b); \
        if (!a_ || strcmp(a_, b_)) FAILF("%s == \"%s\", expected \"%s\"", #a, a_ ? a_ : "(null)", b_); \
    } while (0)
/* |a - b| <= atol + rtol * |b| */
#define CHECK_CLOSE(a, b, atol, rtol) \
    do { \
        double a_ = (a), b_ = (b); \
        if (!(fabs(a_ - b_) <= (atol) + (rtol)*fabs(b_))) \
            FAILF("%s = %.9g, expected %.9g (atol %g, rtol %g)", #a, a_, b_, (double)(atol), (double)(rtol)); \
    } while (0)

/* Relative L2 error ||a - b|| / max(||b||, tiny). */
static inline double rel_l2(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return sqrt(num) / (den > 1e-30 ? sqrt(den) : 1e-15);
}

/* Deterministic random floats in [-scale, scale): tests never use all-zero inputs. */
static inline float check_randf(unsigned long long *s, float scale) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return scale * (2.0f * (float)((*s >> 40) & 0xFFFFFF) / 16777216.0f - 1.0f);
}
static inline void check_fill(float *x, size_t n, unsigned long long seed, float scale) {
    unsigned long long s = seed * 0x9E3779B97F4A7C15ULL + 1;
    for (size_t i = 0; i < n; i++) x[i] = check_randf(&s, scale);
}
#endif
