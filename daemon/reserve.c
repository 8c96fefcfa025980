/* reserve.c — the ballast file of reserve.h. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "daemon/reserve.h"

static void reserve_path(const char *data_dir, char *out, size_t n) { snprintf(out, n, "%s/grpod.reserve", data_dir); }

int reserve_keep(const char *data_dir) {
    char p[1100];
    reserve_path(data_dir, p, sizeof p);
    if (access(p, F_OK) == 0) return 0;
    int fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return err_set(GE_IO, "%s: cannot create: %s", p, strerror(errno));
    int e = posix_fallocate(fd, 0, RESERVE_BYTES); /* real blocks: a sparse file would free nothing */
    if (!e && fsync(fd)) e = errno;
    close(fd);
    if (e) {
        unlink(p);
        return err_set(GE_IO, "%s: cannot reserve %d bytes: %s", p, RESERVE_BYTES, strerror(e));
    }
    return 0;
}

int reserve_release(const char *data_dir) {
    char p[1100];
    reserve_path(data_dir, p, sizeof p);
    return unlink(p) == 0;
}
