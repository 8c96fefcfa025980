/* sdnotify.h — systemd's readiness/watchdog protocol (sd_notify) without libsystemd.
 *
 * When systemd (or a test) starts grpod with NOTIFY_SOCKET set, it listens on a Unix datagram
 * socket at that path ("/run/systemd/notify") or abstract name ("@name"); each sdn_notify()
 * sends one datagram of newline-separated KEY=VALUE lines: "READY=1", "STATUS=...",
 * "WATCHDOG=1", "RELOADING=1", "STOPPING=1". With NOTIFY_SOCKET unset every call is a no-op
 * returning 0, so callers never test sdn_enabled() before notifying.
 *
 * Watchdog: WATCHDOG_USEC is the interval systemd expects pings within; it applies to this
 * process only when WATCHDOG_PID is unset or equals getpid(). Callers ping at half of it.
 *
 * Not this module: the timer that sends WATCHDOG=1 and the check that the engine is alive
 * (daemon/serve.c). Threads: sdn_init() once from main before threads start; sdn_notify() may
 * then be called from any thread (one sendto() on a socket opened by sdn_init, no shared state
 * written). The environment is read, never modified (grpod spawns no children that could
 * inherit NOTIFY_SOCKET by mistake). */
#ifndef GRPOD_SDNOTIFY_H
#define GRPOD_SDNOTIFY_H

/* Read NOTIFY_SOCKET, WATCHDOG_USEC, WATCHDOG_PID. Always returns 0: a malformed value is
 * treated as unset (failing start over an optional feature would be worse) and described by
 * sdn_init_note() for the caller to log. Calling again re-reads the environment (tests do). */
int sdn_init(void);

/* 1 when NOTIFY_SOCKET was set and usable at sdn_init(), else 0. */
int sdn_enabled(void);

/* Send msg as one datagram. 0 when sent or when notify is not enabled; GE_IO (with err_set
 * naming the socket and errno) when the socket cannot be reached. Never blocks for long:
 * the socket is non-blocking (a full receive queue gives GE_IO, not a stall). */
int sdn_notify(const char *msg);

/* printf-style convenience: sdn_notifyf("STATUS=policy v%d, %d queued", v, q).
 * Messages longer than 4 KiB are truncated. */
int sdn_notifyf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Watchdog interval in microseconds for this process; 0 when WATCHDOG_USEC is unset, not a
 * positive integer, or WATCHDOG_PID names another process. */
unsigned long long sdn_watchdog_usec(void);

/* Why the environment was ignored at the last sdn_init() (e.g. "NOTIFY_SOCKET: path longer
 * than 107 bytes"), or "" when all was well: main logs it once at start. */
const char *sdn_init_note(void);
#endif
