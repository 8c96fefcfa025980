/* clock.h — the two clocks, named: monotonic for durations, deadlines and heartbeats (never
 * steps back, not comparable across processes); wall for timestamps stored or shown (seconds
 * since the Unix epoch, may step when the system clock is set). */
#ifndef GRPOD_CLOCK_H
#define GRPOD_CLOCK_H
double clock_mono_s(void); /* CLOCK_MONOTONIC, seconds */
double clock_mono_ms(void); /* CLOCK_MONOTONIC, milliseconds */
long long clock_mono_ns(void); /* CLOCK_MONOTONIC, nanoseconds */
double clock_wall_s(void); /* CLOCK_REALTIME, seconds since 1970-01-01 UTC */
/* *ts = CLOCK_REALTIME secs from now: the deadline pthread_cond_timedwait takes for a condition
 * variable of the default clock. */
struct timespec;
void clock_wall_after(double secs, struct timespec *ts);
#endif
