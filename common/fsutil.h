/* fsutil.h — small filesystem helpers shared by the engine, the store and the CLI. */
#ifndef GRPOD_FSUTIL_H
#define GRPOD_FSUTIL_H
/* mkdir -p: creates path and its missing parents (0755); 0, or GE_IO / GE_INVALID with a
 * message naming the directory. An existing directory is fine; an existing file is an error. */
int fs_mkdirs(const char *path);
#endif
