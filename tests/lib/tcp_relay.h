/* A TCP relay for fault tests: listens on a loopback port and forwards every connection it accepts to a
 * target port on loopback, both ways, until it is cut. Cut, it is a network partition rather than a crash:
 * it stops reading and accepting, so the peers' connections stay open and simply go silent (no reset, no
 * close; the kernel's buffers fill), and new connections are never answered past the kernel's backlog.
 * Healed, it forwards again whatever waited. One thread; the target may be set after the relay starts (a
 * server that must be told the relay's port before it binds its own). */
#ifndef CARLS_TCP_RELAY_H
#define CARLS_TCP_RELAY_H

#include <stdbool.h>
#include <stdint.h>

typedef struct tcp_relay tcp_relay_t;

/* Listens on 127.0.0.1 at a free port and starts the thread; target_port 0: set later. NULL on failure
 * (perror'd). */
tcp_relay_t *tcp_relay_new(uint16_t target_port);

/* The port it listens on. */
uint16_t tcp_relay_port(const tcp_relay_t *self);

/* Where connections accepted from now on go (127.0.0.1:port). Accepted while there is none, they are closed. */
void tcp_relay_set_target(tcp_relay_t *self, uint16_t port);

/* cut true: the partition begins (nothing is forwarded or accepted); false: it ends. */
void tcp_relay_cut(tcp_relay_t *self, bool cut);

/* Bytes forwarded so far, both ways. */
uint64_t tcp_relay_bytes(const tcp_relay_t *self);

/* Stops the thread and closes every connection. Accepts NULL and *self_p == NULL; nulls *self_p. */
void tcp_relay_destroy(tcp_relay_t **self_p);

#endif
