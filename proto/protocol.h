/* Protocol constants and helpers shared by the server and every client (see proto/carls.proto and
 * docs/PROTOCOL.md). */
#ifndef CARLS_PROTOCOL_H
#define CARLS_PROTOCOL_H

#include "carls.pb-c.h"
#include "util.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CARLS_PROTOCOL_VERSION 1u

/* Default limits; the server takes each as a flag. Clients use them to refuse oversized requests early. */
#define CARLS_DEFAULT_MAX_MESSAGE_BYTES (64u << 20) /* one request or response frame */
#define CARLS_DEFAULT_MAX_KEY_BYTES 1024u
#define CARLS_DEFAULT_MAX_DIM 4096u
#define CARLS_DEFAULT_MAX_KEYS_PER_REQUEST 100000u
#define CARLS_MAX_TABLE_NAME_BYTES 128u
#define CARLS_MAX_PENDING_LIMIT 1024u
#define CARLS_MAX_KNN_K 4096u /* neighbours per knn query (kb_knn.h's KB_KNN_MAX_K is the index's own, no lower) */

/* Short stable name of a status code ("OK", "INVALID_ARGUMENT", ...). */
const char *carls_status_name(Carls__StatusCode status);

/* Name of the operation a request carries ("lookup", "put", ...), or "none". */
const char *carls_op_name(Carls__Request__OpCase op);

/* The shard (0..n-1) that owns key among n shards. Depends on nothing but the key bytes and n; clients
 * route with it and a server started with --shard i/n refuses keys of other shards. */
uint32_t carls_shard_of(const void *key, size_t len, uint32_t n);

/* A proto enum value's name on command lines, in listings and in the Python package: its name in carls.proto
 * without the prefix, in lower case with '-' for '_': OPT_SGD is "sgd", OUTLIER_NORM_MEDIAN "norm-median",
 * SAMPLE_LOG_UNIFORM "log-uniform". So a value added to the proto gets its name without an edit. Returned by
 * value, so it can be printed straight from the call. */
typedef struct {
    char text[64];
} carls_enum_name_t;
carls_enum_name_t carls_enum_name(const ProtobufCEnumValue *v);

/* The name of value among names' values, or "unknown". */
carls_enum_name_t carls_enum_name_of(const ProtobufCEnumDescriptor *names, int value);

/* The value of names called text (as carls_enum_name writes it) into *out. 0, or -1 when none is. */
int carls_enum_parse(const ProtobufCEnumDescriptor *names, const char *text, int *out);

/* Table names: 1..CARLS_MAX_TABLE_NAME_BYTES of [A-Za-z0-9_.-]. True when name is one. */
bool carls_table_name_valid(const char *name);

/* The operation of a packed Request, read from its top-level field tags alone (nothing is decoded or
 * allocated), or CARLS__REQUEST__OP__NOT_SET when the frame names none or cannot be read that far. For
 * routing a frame before it is decoded; the decoder still checks everything. */
Carls__Request__OpCase carls_request_peek_op(const uint8_t *frame, size_t len);

#endif
