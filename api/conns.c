/* conns.c — connection admission and deadlines; see conns.h. One list, oldest first, under one
 * lock; a scan per accepted connection (the list holds at most MHD's connection limit). */
#include "api/conns.h"

#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "common/err.h"

typedef struct ent {
    struct ent *prev, *next;
    int fd;
    unsigned char addr[16]; /* the client's IPv4 or IPv6 address */
    int addr_len;
    double since; /* accept or last reply: the waiting deadline runs from here */
    int busy, cut;
} ent;

struct api_conns {
    api_conn_limits lim;
    pthread_mutex_t mu;
    ent *head, *tail;
    long long n_open, n_waiting, n_cut;
};

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int api_conns_create(const api_conn_limits *l, api_conns **out) {
    api_conns *a = calloc(1, sizeof *a);
    if (!a) return err_set(GE_NOMEM, "api: out of memory");
    a->lim = *l;
    pthread_mutex_init(&a->mu, NULL);
    *out = a;
    return 0;
}

void api_conns_free(api_conns *a) {
    if (!a) return;
    for (ent *e = a->head, *n; e; e = n) {
        n = e->next;
        free(e);
    }
    pthread_mutex_destroy(&a->mu);
    free(a);
}

/* Shuts e's socket down (both ways): MHD sees the end on its next poll and closes it. */
static void cut(api_conns *a, ent *e) {
    if (e->cut) return;
    e->cut = 1;
    shutdown(e->fd, SHUT_RDWR);
    a->n_cut++;
    if (!e->busy) a->n_waiting--;
}

static int same_client(const ent *x, const ent *y) {
    return x->addr_len == y->addr_len && memcmp(x->addr, y->addr, (size_t)x->addr_len) == 0;
}

static void admit(api_conns *a, ent *e) {
    if (a->n_waiting > a->lim.max_waiting)
        for (ent *o = a->head; o; o = o->next)
            if (o != e && !o->busy && !o->cut) {
                cut(a, o);
                break;
            }
    int mine = 0;
    ent *oldest = NULL;
    for (ent *o = a->head; o; o = o->next)
        if (!o->cut && same_client(o, e)) {
            mine++;
            if (!oldest && !o->busy) oldest = o;
        }
    if (mine > a->lim.max_per_client) cut(a, oldest ? oldest : e);
}

static void client_addr(struct MHD_Connection *c, ent *e) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    const struct sockaddr *sa = ci ? ci->client_addr : NULL;
    if (sa && sa->sa_family == AF_INET) {
        memcpy(e->addr, &((const struct sockaddr_in *)sa)->sin_addr, 4);
        e->addr_len = 4;
    } else if (sa && sa->sa_family == AF_INET6) {
        memcpy(e->addr, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
        e->addr_len = 16;
    }
}

void api_conns_notify(void *cls, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode code) {
    api_conns *a = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        ent *e = calloc(1, sizeof *e);
        if (!e) return; /* untracked: MHD's own limits still apply */
        const union MHD_ConnectionInfo *fi = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        e->fd = fi ? fi->connect_fd : -1;
        client_addr(c, e);
        e->since = mono_s();
        pthread_mutex_lock(&a->mu);
        e->prev = a->tail;
        if (a->tail) a->tail->next = e;
        else a->head = e;
        a->tail = e;
        a->n_open++;
        a->n_waiting++;
        if (e->fd >= 0) admit(a, e);
        pthread_mutex_unlock(&a->mu);
        *socket_context = e;
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        ent *e = *socket_context;
        if (!e) return;
        pthread_mutex_lock(&a->mu);
        if (e->prev) e->prev->next = e->next;
        else a->head = e->next;
        if (e->next) e->next->prev = e->prev;
        else a->tail = e->prev;
        a->n_open--;
        if (!e->busy && !e->cut) a->n_waiting--;
        pthread_mutex_unlock(&a->mu);
        free(e);
        *socket_context = NULL;
    }
}

void api_conns_set_busy(api_conns *a, struct MHD_Connection *c, int busy) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    ent *e = ci ? ci->socket_context : NULL;
    if (!e) return;
    pthread_mutex_lock(&a->mu);
    if (e->busy != busy && !e->cut) a->n_waiting += busy ? -1 : 1;
    e->busy = busy;
    if (!busy) e->since = mono_s();
    pthread_mutex_unlock(&a->mu);
}

int api_conns_sweep(api_conns *a, double now) {
    int n = 0;
    if (now <= 0) now = mono_s();
    pthread_mutex_lock(&a->mu);
    for (ent *e = a->head; e; e = e->next)
        if (!e->busy && !e->cut && e->fd >= 0 && now - e->since > a->lim.request_timeout_s) {
            cut(a, e);
            n++;
        }
    pthread_mutex_unlock(&a->mu);
    return n;
}

void api_conns_counts(api_conns *a, long long *open, long long *waiting, long long *cuts) {
    pthread_mutex_lock(&a->mu);
    *open = a->n_open;
    *waiting = a->n_waiting;
    *cuts = a->n_cut;
    pthread_mutex_unlock(&a->mu);
}
