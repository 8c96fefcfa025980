/* test_sdnotify.c — daemon/sdnotify.c against a real Unix datagram socket: the test plays
 * systemd, binding the socket that NOTIFY_SOCKET names (a /tmp path, then an abstract name),
 * and checks every datagram byte for byte; then WATCHDOG_USEC / WATCHDOG_PID parsing and the
 * disabled and unreachable cases. */
#include "common/err.h"
#include "daemon/sdnotify.h"
#include "tests/unit/check.h"

#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* Bind a datagram socket at name ("/path" or "@abstract"); -1 on failure. */
static int listen_dgram(const char *name) {
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    size_t n = strlen(name);
    memcpy(a.sun_path, name, n);
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + 1);
    if (name[0] == '@') {
        a.sun_path[0] = '\0';
        len--;
    }
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (bind(fd, (struct sockaddr *)&a, len) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Receive one datagram within 1 s into buf (NUL-terminated); its length or -1. */
static ssize_t recv_one(int fd, char *buf, size_t cap) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 1000) != 1) return -1;
    ssize_t r = recv(fd, buf, cap - 1, 0);
    if (r >= 0) buf[r] = '\0';
    return r;
}

/* Nothing waiting on fd within ms. */
static int quiet(int fd, int ms) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, ms) == 0;
}

static void clear_env(void) {
    unsetenv("NOTIFY_SOCKET");
    unsetenv("WATCHDOG_USEC");
    unsetenv("WATCHDOG_PID");
}

TEST(test_disabled_is_noop) {
    clear_env();
    CHECK_EQ_INT(sdn_init(), 0);
    CHECK_EQ_INT(sdn_enabled(), 0);
    CHECK_EQ_INT(sdn_notify("READY=1"), 0);
    CHECK_EQ_INT(sdn_notifyf("STATUS=%d", 3), 0);
    CHECK_EQ_INT((long long)sdn_watchdog_usec(), 0);
    CHECK_STR(sdn_init_note(), "");
}

TEST(test_path_socket_messages) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/grpod-sdn-%d.sock", (int)getpid());
    unlink(path);
    int fd = listen_dgram(path);
    CHECK_MSG(fd >= 0, "bind %s: %s", path, strerror(errno));
    clear_env();
    setenv("NOTIFY_SOCKET", path, 1);
    sdn_init();
    int ok = sdn_enabled();
    const char *msgs[] = {"READY=1", "STATUS=policy v0, 0 queued", "WATCHDOG=1", "RELOADING=1\nMONOTONIC_USEC=123", "STOPPING=1"};
    char buf[8192];
    for (size_t i = 0; ok && i < sizeof msgs / sizeof *msgs; i++) {
        int rc = sdn_notify(msgs[i]);
        ssize_t n = recv_one(fd, buf, sizeof buf);
        if (rc != 0 || n != (ssize_t)strlen(msgs[i]) || strcmp(buf, msgs[i])) {
            close(fd);
            unlink(path);
            FAILF("msg %zu: rc %d, got %zd bytes \"%s\", expected \"%s\"", i, rc, n, n >= 0 ? buf : "", msgs[i]);
        }
    }
    /* printf form; an over-long message is truncated to one datagram, not split. */
    int rc1 = sdn_notifyf("STATUS=policy v%d, %d queued", 7, 42);
    ssize_t n1 = recv_one(fd, buf, sizeof buf);
    int same = n1 > 0 && !strcmp(buf, "STATUS=policy v7, 42 queued");
    char big[6000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    int rc2 = sdn_notifyf("STATUS=%s", big);
    ssize_t n2 = recv_one(fd, buf, sizeof buf);
    int none_left = quiet(fd, 20);
    close(fd);
    unlink(path);
    CHECK(ok);
    CHECK_EQ_INT(rc1, 0);
    CHECK_MSG(same, "got \"%s\"", buf);
    CHECK_EQ_INT(rc2, 0);
    CHECK_EQ_INT(n2, 4095);
    CHECK(none_left);
}

TEST(test_abstract_socket) {
    char name[64];
    snprintf(name, sizeof name, "@grpod-sdn-test-%d", (int)getpid());
    int fd = listen_dgram(name);
    CHECK_MSG(fd >= 0, "bind %s: %s", name, strerror(errno));
    clear_env();
    setenv("NOTIFY_SOCKET", name, 1);
    sdn_init();
    int en = sdn_enabled(), rc = sdn_notify("READY=1\nSTATUS=abstract");
    char buf[256];
    ssize_t n = recv_one(fd, buf, sizeof buf);
    close(fd);
    CHECK(en);
    CHECK_EQ_INT(rc, 0);
    CHECK_MSG(n > 0 && !strcmp(buf, "READY=1\nSTATUS=abstract"), "got %zd \"%s\"", n, n > 0 ? buf : "");
    /* A name that nobody bound: the datagram has nowhere to go, an I/O error with the name. */
    snprintf(name, sizeof name, "@grpod-sdn-nobody-%d", (int)getpid());
    setenv("NOTIFY_SOCKET", name, 1);
    sdn_init();
    rc = sdn_notify("READY=1");
    CHECK_EQ_INT(rc, GE_IO);
    CHECK_MSG(strstr(err_msg(), "grpod-sdn-nobody") != NULL, "err_msg \"%s\"", err_msg());
}

TEST(test_bad_socket_values) {
    clear_env();
    setenv("NOTIFY_SOCKET", "vsock:2:1234", 1);
    sdn_init();
    CHECK_EQ_INT(sdn_enabled(), 0);
    CHECK(strstr(sdn_init_note(), "NOTIFY_SOCKET") != NULL);
    CHECK_EQ_INT(sdn_notify("READY=1"), 0);
    char longp[200];
    memset(longp, 'a', sizeof longp - 1);
    longp[0] = '/';
    longp[sizeof longp - 1] = '\0';
    setenv("NOTIFY_SOCKET", longp, 1);
    sdn_init();
    CHECK_EQ_INT(sdn_enabled(), 0);
    CHECK(strstr(sdn_init_note(), "length") != NULL);
    setenv("NOTIFY_SOCKET", "@", 1);
    sdn_init();
    CHECK_EQ_INT(sdn_enabled(), 0);
    setenv("NOTIFY_SOCKET", "", 1);
    sdn_init();
    CHECK_EQ_INT(sdn_enabled(), 0);
    clear_env();
}

TEST(test_watchdog_usec) {
    char pid[32];
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    clear_env();
    setenv("WATCHDOG_USEC", "400000", 1);
    sdn_init();
    CHECK_EQ_INT((long long)sdn_watchdog_usec(), 400000);
    setenv("WATCHDOG_PID", pid, 1); /* our pid: applies */
    sdn_init();
    CHECK_EQ_INT((long long)sdn_watchdog_usec(), 400000);
    setenv("WATCHDOG_USEC", "60000000", 1); /* WatchdogSec=60 */
    sdn_init();
    CHECK_EQ_INT((long long)sdn_watchdog_usec(), 60000000);
    snprintf(pid, sizeof pid, "%d", (int)getpid() + 1);
    setenv("WATCHDOG_PID", pid, 1); /* another process's watchdog */
    sdn_init();
    CHECK_EQ_INT((long long)sdn_watchdog_usec(), 0);
    setenv("WATCHDOG_PID", "12x", 1);
    sdn_init();
    CHECK_EQ_INT((long long)sdn_watchdog_usec(), 0);
    unsetenv("WATCHDOG_PID");
    const char *bad[] = {"", "abc", "-5", "+5", "10s", "99999999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        setenv("WATCHDOG_USEC", bad[i], 1);
        sdn_init();
        CHECK_MSG(sdn_watchdog_usec() == 0, "WATCHDOG_USEC=\"%s\" gave %llu", bad[i], sdn_watchdog_usec());
    }
    setenv("WATCHDOG_USEC", "abc", 1);
    sdn_init();
    CHECK(strstr(sdn_init_note(), "WATCHDOG_USEC") != NULL);
    setenv("WATCHDOG_USEC", "0", 1); /* 0 means disabled */
    sdn_init();
    CHECK_EQ_INT((long long)sdn_watchdog_usec(), 0);
    clear_env();
}

int main(void) {
    RUN(test_disabled_is_noop);
    RUN(test_path_socket_messages);
    RUN(test_abstract_socket);
    RUN(test_bad_socket_values);
    RUN(test_watchdog_usec);
    return CHECK_DONE();
}
