/* reserve.h — a ballast file, DATA_DIR/grpod.reserve (RESERVE_BYTES), so that grpod can start on
 * a disk that filled up while it was down. SQLite in WAL mode needs a few pages of room to open
 * (the -shm index, the -wal file, the recovery of running jobs): on a completely full disk the
 * store cannot open and the daemon could never start again. Each start keeps the reserve (makes
 * it when there is room); a start whose store cannot open removes it and tries once more, with a
 * warning (docs/api.md "Crashes and replay").
 * Threads: main only, before the store and the engine thread exist. */
#ifndef GRPOD_RESERVE_H
#define GRPOD_RESERVE_H

enum { RESERVE_BYTES = 1 << 20 };

/* Makes DATA_DIR/grpod.reserve when it is missing: 0 when it is there, or GE_IO (no room: the
 * start goes on without one; nothing is left half-made). */
int reserve_keep(const char *data_dir);
/* Removes it: 1 when there was one to remove, else 0. */
int reserve_release(const char *data_dir);
#endif
