/* The kb-server's transport: a ZeroMQ ROUTER socket facing clients, a pool of worker threads behind an
 * inproc DEALER socket, and a main loop that moves frames between them.
 *
 * Each client message must be one frame (one packed Request). A worker receives [client identity,
 * request], asks the service for the reply and sends [identity, reply] back. Multi-part messages are
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
    uint32_t threads;          /* worker threads, >= 1 */
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

/* Serves until *stop becomes nonzero (set it from a signal handler), then lets the workers finish the
 * requests they hold and delivers their replies. */
void kb_server_run(kb_server_t *self, volatile sig_atomic_t *stop);

/* Clients admitted and refused by CURVE authentication (0 without CURVE). */
void kb_server_auth_counts(const kb_server_t *self, uint64_t *allowed, uint64_t *denied);

/* Stops the workers (if still running) and closes the sockets. Accepts NULL; nulls *self_p. */
void kb_server_destroy(kb_server_t **self_p);

#endif
