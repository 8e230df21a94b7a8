#include "tcp_relay.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define S_MAX_PAIRS 16
#define S_POLL_MS 20

struct tcp_relay {
    int listen_fd;
    uint16_t port;
    atomic_uint target;    /* 0: none yet */
    atomic_bool cut, stop;
    atomic_uint_fast64_t bytes;
    pthread_t thread;
    int fds[S_MAX_PAIRS][2]; /* accepted (0) and its connection to the target (1); -1: free. Thread only. */
};

static int s_connect_target(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(port)};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

static void s_close_pair(int pair[2])
{
    for (int side = 0; side < 2; side++) {
        if (pair[side] >= 0)
            close(pair[side]);
        pair[side] = -1;
    }
}

static void s_accept(tcp_relay_t *self)
{
    int fd = accept4(self->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0)
        return;
    uint16_t target = (uint16_t)atomic_load(&self->target);
    int to = target ? s_connect_target(target) : -1;
    for (int i = 0; to >= 0 && i < S_MAX_PAIRS; i++) {
        if (self->fds[i][0] < 0) {
            self->fds[i][0] = fd;
            self->fds[i][1] = to;
            return;
        }
    }
    close(fd); /* no target, the target refused, or no room */
    if (to >= 0)
        close(to);
}

/* Moves what one side has to the other; -1 when the pair is over (a side closed or failed). */
static int s_forward(tcp_relay_t *self, int from, int to)
{
    char buf[16384];
    ssize_t n = read(from, buf, sizeof buf);
    if (n <= 0)
        return -1;
    for (ssize_t done = 0; done < n;) {
        ssize_t w = write(to, buf + done, (size_t)(n - done));
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        done += w;
    }
    atomic_fetch_add(&self->bytes, (uint64_t)n);
    return 0;
}

static void *s_main(void *arg)
{
    tcp_relay_t *self = arg;
    while (!atomic_load(&self->stop)) {
        if (atomic_load(&self->cut)) { /* a partition: nobody is read, nobody accepted */
            usleep(S_POLL_MS * 1000);
            continue;
        }
        struct pollfd p[1 + 2 * S_MAX_PAIRS];
        int at[1 + 2 * S_MAX_PAIRS];
        int n = 0;
        p[n++] = (struct pollfd){.fd = self->listen_fd, .events = POLLIN};
        for (int i = 0; i < S_MAX_PAIRS; i++)
            for (int side = 0; side < 2 && self->fds[i][0] >= 0; side++) {
                at[n] = i * 2 + side;
                p[n++] = (struct pollfd){.fd = self->fds[i][side], .events = POLLIN};
            }
        if (poll(p, (nfds_t)n, S_POLL_MS) <= 0)
            continue;
        for (int k = 1; k < n; k++) {
            int i = at[k] / 2, side = at[k] % 2;
            if (self->fds[i][0] < 0 || !(p[k].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            if (s_forward(self, self->fds[i][side], self->fds[i][1 - side]) != 0)
                s_close_pair(self->fds[i]);
        }
        if (p[0].revents & POLLIN)
            s_accept(self);
    }
    return NULL;
}

tcp_relay_t *tcp_relay_new(uint16_t target_port)
{
    tcp_relay_t *self = calloc(1, sizeof *self);
    if (!self)
        return NULL;
    for (int i = 0; i < S_MAX_PAIRS; i++)
        self->fds[i][0] = self->fds[i][1] = -1;
    atomic_init(&self->target, target_port);
    atomic_init(&self->cut, false);
    atomic_init(&self->stop, false);
    atomic_init(&self->bytes, 0);
    self->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = 0};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (self->listen_fd < 0 || bind(self->listen_fd, (struct sockaddr *)&addr, sizeof addr) != 0 ||
        listen(self->listen_fd, 8) != 0 || getsockname(self->listen_fd, (struct sockaddr *)&addr, &len) != 0) {
        perror("tcp_relay_new");
        if (self->listen_fd >= 0)
            close(self->listen_fd);
        free(self);
        return NULL;
    }
    self->port = ntohs(addr.sin_port);
    if (pthread_create(&self->thread, NULL, s_main, self) != 0) {
        perror("tcp_relay_new: pthread_create");
        close(self->listen_fd);
        free(self);
        return NULL;
    }
    return self;
}

uint16_t tcp_relay_port(const tcp_relay_t *self) { return self->port; }

void tcp_relay_set_target(tcp_relay_t *self, uint16_t port) { atomic_store(&self->target, port); }

void tcp_relay_cut(tcp_relay_t *self, bool cut) { atomic_store(&self->cut, cut); }

uint64_t tcp_relay_bytes(const tcp_relay_t *self) { return atomic_load(&self->bytes); }

void tcp_relay_destroy(tcp_relay_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    tcp_relay_t *self = *self_p;
    atomic_store(&self->stop, true);
    pthread_join(self->thread, NULL);
    for (int i = 0; i < S_MAX_PAIRS; i++)
        s_close_pair(self->fds[i]);
    close(self->listen_fd);
    free(self);
    *self_p = NULL;
}
