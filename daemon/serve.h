/* serve.h — `grpod serve`: the daemon's entry point (flags, config file, environment,
 * the libuv main loop, signals, timers, sd_notify). daemon/main.c dispatches to it. */
#ifndef GRPOD_DAEMON_SERVE_H
#define GRPOD_DAEMON_SERVE_H
/* argv[0] == "serve". Returns the process exit status (0 after a clean SIGTERM/SIGINT drain,
 * 2 for bad flags or a refused configuration, 1 for a failed start). */
int serve_main(int argc, char **argv);
#endif
