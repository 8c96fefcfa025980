/* clock.c — see clock.h. */
#include "common/clock.h"

#include <time.h>

long long clock_mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}
double clock_mono_s(void) { return (double)clock_mono_ns() * 1e-9; }
double clock_mono_ms(void) { return (double)clock_mono_ns() * 1e-6; }

void clock_wall_after(double secs, struct timespec *ts) {
    clock_gettime(CLOCK_REALTIME, ts);
    long long ns = ts->tv_nsec + (long long)(secs * 1e9);
    ts->tv_sec += (time_t)(ns / 1000000000LL);
    ts->tv_nsec = (long)(ns % 1000000000LL);
}

double clock_wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}
