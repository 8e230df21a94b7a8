/* A bare ZeroMQ DEALER for tests that must send exactly the bytes they choose (garbage, truncated or
 * replayed requests) to a kb-server. */
#ifndef CARLS_RAW_CLIENT_H
#define CARLS_RAW_CLIENT_H

#include "carls.pb-c.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    void *ctx;
    void *socket;
} raw_client_t;

int raw_open(raw_client_t *rc, const char *endpoint);
/* raw_open with CURVE: client key pair file (kb-keygen's NAME.key) and the server's public key file. */
int raw_open_curve(raw_client_t *rc, const char *endpoint, const char *client_key_file, const char *server_pub_file);
void raw_close(raw_client_t *rc);

/* Sends one frame. 0 on success. */
int raw_send(raw_client_t *rc, const void *data, size_t len);
/* Sends a multi-part message of n frames. */
int raw_send_parts(raw_client_t *rc, const void *const *parts, const size_t *lens, int n);

/* Waits up to timeout_ms for one reply frame and decodes it. NULL on timeout or undecodable reply. */
Carls__Response *raw_recv(raw_client_t *rc, int timeout_ms);

/* Packs req, sends it, waits for the reply. */
Carls__Response *raw_call(raw_client_t *rc, const Carls__Request *req, int timeout_ms);

/* Sends write request req, asserts an OK reply (cmocka), and returns whether the server answered it as a
 * duplicate: a replay of a (client_id, sequence) it had applied already. */
bool raw_write_is_duplicate(raw_client_t *rc, const Carls__Request *req, int timeout_ms);

#endif
