/* serve.h — `grpod serve`: the daemon's entry point (flags, config file, environment,
 * the libuv main loop, signals, timers, sd_notify). daemon/main.c dispatches to it. */
#ifndef GRPOD_DAEMON_SERVE_H
#define GRPOD_DAEMON_SERVE_H
/* argv[0] == "serve". Returns the process exit status (0 after a clean SIGTERM/SIGINT drain,
 * 2 for bad flags or a refused configuration, 1 for a failed start, 75 after a stop while a
 * follower was lost), or SERVE_REEXEC: a leader whose lost follower joined again stopped
 * cleanly (its store, port and lock released) to start a new epoch, and the caller replaces
 * the process with a fresh image of itself (crash-only recovery without a service manager;
 * exit 75 if that fails, so a service manager restarts it). */
#define SERVE_REEXEC (-75)
int serve_main(int argc, char **argv);
#endif
