/* sdnotify.c — sd_notify(3) and sd_watchdog_enabled(3) in ~150 lines, no libsystemd.
 *
 * The protocol (systemd's sd_notify man page, "Notes"): a Unix SOCK_DGRAM socket whose address
 * is NOTIFY_SOCKET — a filesystem path, or an abstract name written with a leading '@' that
 * stands for the leading NUL byte. Each notification is one datagram of newline-separated
 * assignments. systemd identifies the sender by its credentials, so nothing else is needed for
 * NotifyAccess=main.
 *
 * One datagram socket is opened at sdn_init() and reused: sendto() on a connectionless socket
 * is safe from several threads, and the watchdog ping then costs one syscall. */
#include "daemon/sdnotify.h"
#include "common/err.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static int sdn_fd_ = -1;
static struct sockaddr_un sdn_addr_;
static socklen_t sdn_addr_len_;
static unsigned long long sdn_wd_usec_;
static char sdn_note_[160];

/* ---- environment parsing ---------------------------------------------------------------- */

/* Parse an unsigned decimal with nothing after it; 0 and -1 on failure or empty. */
static int sdn_parse_ull(const char *s, unsigned long long *out) {
    if (!s || !*s || *s == '-' || *s == '+') return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end) return -1;
    *out = v;
    return 0;
}

/* Fill sdn_addr_ from NOTIFY_SOCKET; -1 (with a note) when it cannot be used. */
static int sdn_parse_socket(const char *s) {
    size_t n = strlen(s);
    memset(&sdn_addr_, 0, sizeof sdn_addr_);
    sdn_addr_.sun_family = AF_UNIX;
    if (s[0] != '/' && s[0] != '@') {
        /* e.g. "vsock:..." (systemd ≥ 253 inside VMs): not supported here. */
        snprintf(sdn_note_, sizeof sdn_note_, "NOTIFY_SOCKET \"%.60s\": only /path and @abstract sockets are supported", s);
        return -1;
    }
    if (n < 2 || n >= sizeof sdn_addr_.sun_path) {
        snprintf(sdn_note_, sizeof sdn_note_, "NOTIFY_SOCKET: length %zu outside 2..%zu", n, sizeof sdn_addr_.sun_path - 1);
        return -1;
    }
    memcpy(sdn_addr_.sun_path, s, n);
    if (s[0] == '@') {
        /* Abstract namespace: the name is exactly the bytes after the NUL, no terminator. */
        sdn_addr_.sun_path[0] = '\0';
        sdn_addr_len_ = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
    } else {
        sdn_addr_len_ = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + 1);
    }
    return 0;
}

/* ---- public API --------------------------------------------------------------------------- */

int sdn_init(void) {
    if (sdn_fd_ >= 0) close(sdn_fd_);
    sdn_fd_ = -1;
    sdn_wd_usec_ = 0;
    sdn_note_[0] = '\0';

    const char *sock = getenv("NOTIFY_SOCKET");
    if (sock && *sock && sdn_parse_socket(sock) == 0) {
        sdn_fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (sdn_fd_ < 0) snprintf(sdn_note_, sizeof sdn_note_, "NOTIFY_SOCKET: socket(): %s", strerror(errno));
    }

    unsigned long long usec = 0, pid = 0;
    const char *wd = getenv("WATCHDOG_USEC"), *wpid = getenv("WATCHDOG_PID");
    if (wd && sdn_parse_ull(wd, &usec) != 0) {
        snprintf(sdn_note_, sizeof sdn_note_, "WATCHDOG_USEC \"%.40s\" is not a number", wd);
        usec = 0;
    }
    if (usec && wpid && *wpid) {
        /* systemd sets WATCHDOG_PID so a forked child does not ping in its parent's name. */
        if (sdn_parse_ull(wpid, &pid) != 0 || pid != (unsigned long long)getpid()) usec = 0;
    }
    sdn_wd_usec_ = usec;
    return 0;
}

int sdn_enabled(void) { return sdn_fd_ >= 0; }

unsigned long long sdn_watchdog_usec(void) { return sdn_wd_usec_; }

const char *sdn_init_note(void) { return sdn_note_; }

int sdn_notify(const char *msg) {
    if (sdn_fd_ < 0 || !msg) return 0;
    size_t len = strlen(msg);
    ssize_t r;
    do {
        r = sendto(sdn_fd_, msg, len, MSG_NOSIGNAL, (const struct sockaddr *)&sdn_addr_, sdn_addr_len_);
    } while (r < 0 && errno == EINTR);
    if (r < 0) {
        int e = errno;
        return err_set(GE_IO, "sd_notify to %s%s: %s", sdn_addr_.sun_path[0] ? "" : "@",
                       sdn_addr_.sun_path[0] ? sdn_addr_.sun_path : sdn_addr_.sun_path + 1, strerror(e));
    }
    if ((size_t)r != len) return err_set(GE_IO, "sd_notify: short datagram %zd of %zu", r, len);
    return 0;
}

int sdn_notifyf(const char *fmt, ...) {
    if (sdn_fd_ < 0) return 0;
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return sdn_notify(buf);
}
