/* fsutil.c — see fsutil.h. */
#include "common/fsutil.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "common/err.h"

int fs_mkdirs(const char *path) {
    char buf[4096];
    if (!*path) return err_set(GE_INVALID, "empty directory path");
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return err_set(GE_INVALID, "directory path too long: %.64s...", path);
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == 0) {
            char c = *p;
            *p = 0;
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return err_set(GE_IO, "creating directory %s: %s", buf, strerror(errno));
            *p = c;
            if (!c) break;
        }
    }
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) return err_set(GE_IO, "%s is not a directory", path);
    return 0;
}
