/* Fuzz target "request": the request decoder alone, fast (no bank, no threads).
 *
 * Each input is one frame. It is decoded as a carls.Request the way kb_service_handle does
 * (carls__request__unpack; NULL is "malformed"), and when it decodes:
 *  - packing the decoded request and decoding that again must succeed, and packing the copy must give the
 *    same bytes (the decoded structure is self-consistent: every count matches its array, every string and
 *    bytes field is readable, nested messages are complete);
 *  - the envelope checks the server makes are run (table name, op name);
 *  - a create_table's config goes through kb_table_config_from_proto, the server's config validation (it
 *    also asks FAISS about a knn spec); when it is accepted, the config in wire form
 *    (kb_table_config_to_proto, what list_tables reports and what an export stores) must validate again to
 *    the identical config, so an exported table can be re-created with if_not_exists. */
#include "fuzz_common.h"

#include "kb_table.h"
#include "kb_table_config.h"
#include "log.h"
#include "protocol.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* Unknown fields hidden for a pack: each message that had some, and how many. */
typedef struct {
    ProtobufCMessage **msgs;
    unsigned *counts;
    size_t n, cap;
} s_hidden_t;

/* Sets n_unknown_fields to 0 in m and every message inside it, remembering the counts in *h. */
static void s_hide_unknown(ProtobufCMessage *m, s_hidden_t *h)
{
    if (!m)
        return;
    if (m->n_unknown_fields > 0) {
        if (h->n == h->cap) {
            h->cap = h->cap ? 2 * h->cap : 16;
            h->msgs = realloc(h->msgs, h->cap * sizeof *h->msgs);
            h->counts = realloc(h->counts, h->cap * sizeof *h->counts);
            FUZZ_CHECK(h->msgs && h->counts);
        }
        h->msgs[h->n] = m;
        h->counts[h->n++] = m->n_unknown_fields;
        m->n_unknown_fields = 0;
    }
    const ProtobufCMessageDescriptor *d = m->descriptor;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (f->type != PROTOBUF_C_TYPE_MESSAGE)
            continue;
        char *base = (char *)m;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t count = *(size_t *)(base + f->quantifier_offset);
            ProtobufCMessage **items = *(ProtobufCMessage ***)(base + f->offset);
            for (size_t j = 0; j < count; j++)
                s_hide_unknown(items[j], h);
        } else if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
                   *(uint32_t *)(base + f->quantifier_offset) != f->id) {
            continue;
        } else {
            s_hide_unknown(*(ProtobufCMessage **)(base + f->offset), h);
        }
    }
}

/* Puts the hidden counts back (so free_unpacked frees the unknown fields). */
static void s_restore_unknown(s_hidden_t *h)
{
    for (size_t i = 0; i < h->n; i++)
        h->msgs[i]->n_unknown_fields = h->counts[i];
    free(h->msgs);
    free(h->counts);
}

static void s_check_config(const Carls__TableConfig *in)
{
    kb_table_config_t cfg, again;
    char err[256];
    if (kb_table_config_from_proto(in, FUZZ_MAX_DIM, &cfg, err, sizeof err) != 0) {
        FUZZ_CHECK(err[0] != '\0');
        return;
    }
    kb_table_config_wire_t wire;
    kb_table_config_to_proto(&cfg, &wire);
    FUZZ_CHECK(kb_table_config_from_proto(&wire.config, FUZZ_MAX_DIM, &again, err, sizeof err) == 0);
    FUZZ_CHECK(memcmp(&cfg, &again, sizeof cfg) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool quiet;
    if (!quiet) {
        carls_log_set_level(CARLS_LOG_OFF);
        quiet = true;
    }
    Carls__Request *req = carls__request__unpack(NULL, size, data);
    if (!req)
        return 0;

    s_hidden_t hidden = {0};
    s_hide_unknown(&req->base, &hidden);
    size_t len = carls__request__get_packed_size(req);
    uint8_t *packed = malloc(len ? len : 1);
    FUZZ_CHECK(packed != NULL);
    FUZZ_CHECK(carls__request__pack(req, packed) == len);
    s_restore_unknown(&hidden);
    Carls__Request *copy = carls__request__unpack(NULL, len, packed);
    FUZZ_CHECK(copy != NULL);
    size_t len2 = carls__request__get_packed_size(copy);
    FUZZ_CHECK(len2 == len);
    uint8_t *packed2 = malloc(len2 ? len2 : 1);
    FUZZ_CHECK(packed2 != NULL);
    FUZZ_CHECK(carls__request__pack(copy, packed2) == len2);
    FUZZ_CHECK(memcmp(packed, packed2, len) == 0);
    FUZZ_CHECK(copy->op_case == req->op_case && copy->request_id == req->request_id);

    (void)carls_table_name_valid(req->table);
    FUZZ_CHECK(carls_op_name(req->op_case) != NULL);
    if (req->op_case == CARLS__REQUEST__OP_CREATE_TABLE)
        s_check_config(req->create_table->config);

    free(packed2);
    free(packed);
    carls__request__free_unpacked(copy, NULL);
    carls__request__free_unpacked(req, NULL);
    return 0;
}
