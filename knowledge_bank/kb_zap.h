/* kb-server's ZAP handler (see docs/SECURITY.md): a thread answering ZeroMQ's authentication requests
 * (ZAP 1.0, RFC 27) on "inproc://zeromq.zap.01" in the server's own ZeroMQ context. A CURVE client whose
 * public key is on the allow-list (proto/kb_keys.h) is accepted (200); every other client is refused (400)
 * and its connection never delivers a message to the server socket. kb_auth_setup_server makes the
 * server's ROUTER a CURVE server that asks this handler.
 *
 * Return convention: 0 on success, a negative KB_AUTH_E* code on failure with a message in err. */
#ifndef KB_ZAP_H
#define KB_ZAP_H

#include "kb_keys.h"

#include <stdint.h>

/* ---- ZAP handler ------------------------------------------------------------------------------------- */

typedef struct kb_auth kb_auth_t;

/* Binds the ZAP endpoint "inproc://zeromq.zap.01" in zmq_ctx (the context of the socket to protect; a ZAP
 * handler serves only its own context) and starts the handler thread. Takes ownership of *allow_p (which
 * must hold a list) and nulls it, also on failure. Returns NULL with a message in err when the endpoint
 * cannot be bound (another handler already runs in this context) or CURVE is unavailable.
 * Start it before the protected socket binds, so no connection is ever accepted without it. */
kb_auth_t *kb_auth_new(void *zmq_ctx, kb_auth_allow_t **allow_p, char *err, size_t errlen);

/* Stops the thread (within ~100 ms) and closes its socket. Call it before zmq_ctx_term on the context, or
 * after: a terminating context also makes the thread close its socket and end. Accepts NULL and
 * *self_p == NULL; nulls *self_p. */
void kb_auth_destroy(kb_auth_t **self_p);

/* Handshakes accepted (status 200) and refused (anything else) so far; safe from any thread. */
uint64_t kb_auth_allowed(const kb_auth_t *self);
uint64_t kb_auth_denied(const kb_auth_t *self);

/* Makes socket (the server's ROUTER, before zmq_bind) a CURVE server with the pair's secret key, in the
 * ZAP domain KB_AUTH_DOMAIN, and asks libzmq to refuse clients when no ZAP handler answers (where libzmq
 * supports that option). auth is the running handler: it must exist first, because a CURVE server with no
 * ZAP handler would accept every client key (KB_AUTH_EINVAL when NULL). */
int kb_auth_setup_server(void *socket, const kb_auth_keypair_t *server, const kb_auth_t *auth, char *err,
                         size_t errlen);

#endif
