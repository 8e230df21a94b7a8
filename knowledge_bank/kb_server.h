/* The kb-server's transport: a ZeroMQ ROUTER socket facing clients, served by one request thread (the one
 * that calls kb_server_run), and a pool of worker threads for the requests that can take long.
 *
 * Each client message must be one frame (one packed Request). The request thread receives [client
 * identity, request] and, for lookups and writes, handles it itself and sends [identity, reply] back: no
 * proxy, no second ZeroMQ hop, and the reply buffer goes to ZeroMQ without a copy. In sync durability a
 * write's reply is parked until the group commit holding it is durable (the persister wakes the thread
 * through an eventfd), so the thread goes on serving meanwhile and any number of writers share one commit.
 * knn, sample, scan, stats, checkpoint, create and drop go to the workers through an in-process queue, and
 * their replies come back the same way, so a slow search never holds up a lookup. Multi-part messages are
 * dropped and counted (there is no single request to answer). ZMQ_MAXMSGSIZE is set to twice the
 * service's message limit: frames between the limit and twice it get a TOO_LARGE reply, larger ones make
 * ZeroMQ drop the connection before anything is allocated for them.
 *
 * With a CURVE secret key and an allow-list, traffic is encrypted and only clients whose public key is on
 * the list get through (a ZAP handler in the server's context answers libzmq's checks; docs/SECURITY.md). */
#ifndef KB_SERVER_H
#define KB_SERVER_H

#include "kb_service.h"

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char *endpoint;      /* e.g. tcp://127.0.0.1:7070; tcp://127.0.0.1:* picks a free port */
    uint32_t threads;          /* worker threads for requests that may block, >= 1 */
    uint32_t max_message_bytes;
    const char *curve_secret_file; /* CURVE: the server's secret key file (kb-keygen); NULL = plain TCP */
    const char *curve_allow_path;  /* CURVE: allowed client public keys (a *.pub directory or a key list) */
} kb_server_options_t;

typedef struct kb_server kb_server_t;

/* Binds the endpoint and starts the workers. The service is borrowed. Returns 0 and *out (caller owns it), or
 * -1 with *out NULL and a message in err. */
int kb_server_new(kb_service_t *service, const kb_server_options_t *opts, kb_server_t **out, char *err,
                  size_t errlen);

/* The endpoint actually bound (with the real port when '*' was asked for). */
const char *kb_server_endpoint(const kb_server_t *self);

/* Serves until *stop becomes nonzero (set it from a signal handler), then answers every request already
 * taken (the workers' and the parked ones) before it returns. */
void kb_server_run(kb_server_t *self, volatile sig_atomic_t *stop);

/* Clients admitted and refused by CURVE authentication (0 without CURVE). */
void kb_server_auth_counts(const kb_server_t *self, uint64_t *allowed, uint64_t *denied);

/* Stops the workers (if still running) and closes the sockets. Accepts NULL; nulls *self_p. */
void kb_server_destroy(kb_server_t **self_p);

#endif
