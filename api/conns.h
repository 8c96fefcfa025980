/* conns.h — admission and deadlines for the HTTP server's connections, so slow or hostile
 * clients cannot take the daemon offline: MHD's idle timeout restarts at every byte and it does
 * not bound the connections of one client, so a thousand clients sending a header byte every few
 * seconds would hold every connection.
 *
 * A connection is "waiting" from its accept (or its previous response) until its request head
 * and body have arrived, and "busy" while a handler or long-poll holds it. Rules:
 *   - a waiting connection gets request_timeout_s in all for its head and body; then its
 *     socket is shut down (not reset by each byte, unlike MHD's idle timeout);
 *   - at most max_waiting connections wait: a new one is always admitted and the oldest
 *     waiting one is shut down instead, so a fresh probe (/healthz, /readyz sends its request at
 *     once) is served while a flood of slow clients holds the cap;
 *   - one client address holds at most max_per_client connections: beyond that its oldest
 *     waiting connection is shut down (the new one when all of its others are busy).
 * The total is MHD's connection limit (api_start), set above max_waiting so busy connections
 * keep room. Shutting a socket down makes MHD close the connection on its own thread; the entry
 * stays valid until MHD's close notification, which takes the same lock.
 *
 * Threads: started/closed/set_busy run on MHD threads, sweep on the main loop's tick. */
#ifndef GRPOD_API_CONNS_H
#define GRPOD_API_CONNS_H
#include <microhttpd.h>

typedef struct api_conns api_conns;

typedef struct {
    int max_waiting; /* connections waiting for their request */
    int max_per_client; /* connections from one address */
    double request_timeout_s; /* head + body of one request, from accept or the last reply */
} api_conn_limits;

int api_conns_create(const api_conn_limits *l, api_conns **out);
void api_conns_free(api_conns *a);

/* MHD_OPTION_NOTIFY_CONNECTION's callback (cls = the api_conns). */
void api_conns_notify(void *cls, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode code);
/* The request of c has fully arrived (busy = 1) or its reply is done (busy = 0). */
void api_conns_set_busy(api_conns *a, struct MHD_Connection *c, int busy);
/* Shuts down waiting connections past their deadline; returns how many. */
int api_conns_sweep(api_conns *a, double now);
/* Totals since the start, for /metrics and tests. */
void api_conns_counts(api_conns *a, long long *open, long long *waiting, long long *cut);
#endif
