#include "raw_client.h"

#include "kb_keys.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include <cmocka.h>

int raw_open(raw_client_t *rc, const char *endpoint)
{
    rc->ctx = zmq_ctx_new();
    rc->socket = zmq_socket(rc->ctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(rc->socket, ZMQ_LINGER, &linger, sizeof linger);
    return zmq_connect(rc->socket, endpoint);
}

int raw_open_curve(raw_client_t *rc, const char *endpoint, const char *client_key_file, const char *server_pub_file)
{
    kb_auth_keypair_t pair;
    kb_auth_key_t server;
    char err[256];
    rc->ctx = zmq_ctx_new();
    rc->socket = zmq_socket(rc->ctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(rc->socket, ZMQ_LINGER, &linger, sizeof linger);
    if (kb_auth_load_secret(client_key_file, &pair, err, sizeof err) != 0 ||
        kb_auth_load_public(server_pub_file, &server, err, sizeof err) != 0 ||
        kb_auth_setup_client(rc->socket, &pair, &server, err, sizeof err) != 0) {
        fprintf(stderr, "raw_open_curve: %s\n", err);
        return -1;
    }
    return zmq_connect(rc->socket, endpoint);
}

void raw_close(raw_client_t *rc)
{
    if (rc->socket)
        zmq_close(rc->socket);
    if (rc->ctx)
        zmq_ctx_term(rc->ctx);
    memset(rc, 0, sizeof *rc);
}

int raw_send(raw_client_t *rc, const void *data, size_t len)
{
    return zmq_send(rc->socket, data, len, 0) < 0 ? -1 : 0;
}

int raw_send_parts(raw_client_t *rc, const void *const *parts, const size_t *lens, int n)
{
    for (int i = 0; i < n; i++)
        if (zmq_send(rc->socket, parts[i], lens[i], i + 1 < n ? ZMQ_SNDMORE : 0) < 0)
            return -1;
    return 0;
}

Carls__Response *raw_recv(raw_client_t *rc, int timeout_ms)
{
    zmq_pollitem_t item = {.socket = rc->socket, .events = ZMQ_POLLIN};
    if (zmq_poll(&item, 1, timeout_ms) <= 0)
        return NULL;
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    if (zmq_msg_recv(&msg, rc->socket, 0) < 0) {
        zmq_msg_close(&msg);
        return NULL;
    }
    Carls__Response *resp = carls__response__unpack(NULL, zmq_msg_size(&msg), zmq_msg_data(&msg));
    zmq_msg_close(&msg);
    return resp;
}

Carls__Response *raw_call(raw_client_t *rc, const Carls__Request *req, int timeout_ms)
{
    size_t len = carls__request__get_packed_size(req);
    uint8_t *buf = malloc(len ? len : 1);
    carls__request__pack(req, buf);
    int rc_send = raw_send(rc, buf, len);
    free(buf);
    return rc_send == 0 ? raw_recv(rc, timeout_ms) : NULL;
}

bool raw_write_is_duplicate(raw_client_t *rc, const Carls__Request *req, int timeout_ms)
{
    Carls__Response *resp = raw_call(rc, req, timeout_ms);
    assert_non_null(resp);
    assert_int_equal(resp->status, CARLS__STATUS_CODE__STATUS_OK);
    assert_non_null(resp->write);
    bool duplicate = resp->write->duplicate;
    carls__response__free_unpacked(resp, NULL);
    return duplicate;
}
