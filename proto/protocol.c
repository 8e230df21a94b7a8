#include "protocol.h"

#include <ctype.h>
#include <string.h>

const char *carls_status_name(Carls__StatusCode status)
{
    switch (status) {
    case CARLS__STATUS_CODE__STATUS_OK: return "OK";
    case CARLS__STATUS_CODE__STATUS_MALFORMED: return "MALFORMED";
    case CARLS__STATUS_CODE__STATUS_UNSUPPORTED_VERSION: return "UNSUPPORTED_VERSION";
    case CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case CARLS__STATUS_CODE__STATUS_NOT_FOUND: return "NOT_FOUND";
    case CARLS__STATUS_CODE__STATUS_ALREADY_EXISTS: return "ALREADY_EXISTS";
    case CARLS__STATUS_CODE__STATUS_TOO_LARGE: return "TOO_LARGE";
    case CARLS__STATUS_CODE__STATUS_READ_ONLY: return "READ_ONLY";
    case CARLS__STATUS_CODE__STATUS_INTERNAL: return "INTERNAL";
    case CARLS__STATUS_CODE__STATUS_UNAVAILABLE: return "UNAVAILABLE";
    case CARLS__STATUS_CODE__STATUS_UNIMPLEMENTED: return "UNIMPLEMENTED";
    case CARLS__STATUS_CODE__STATUS_RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case CARLS__STATUS_CODE__STATUS_NOT_PRIMARY: return "NOT_PRIMARY";
    case CARLS__STATUS_CODE__STATUS_STALE: return "STALE";
    default: return "UNKNOWN_STATUS";
    }
}

const char *carls_op_name(Carls__Request__OpCase op)
{
    switch (op) {
    case CARLS__REQUEST__OP_CREATE_TABLE: return "create_table";
    case CARLS__REQUEST__OP_DROP_TABLE: return "drop_table";
    case CARLS__REQUEST__OP_LIST_TABLES: return "list_tables";
    case CARLS__REQUEST__OP_LOOKUP: return "lookup";
    case CARLS__REQUEST__OP_PUT: return "put";
    case CARLS__REQUEST__OP_PUSH_GRADIENTS: return "push_gradients";
    case CARLS__REQUEST__OP_STATS: return "stats";
    case CARLS__REQUEST__OP_CHECKPOINT: return "checkpoint";
    case CARLS__REQUEST__OP_KNN: return "knn";
    case CARLS__REQUEST__OP_SAMPLE: return "sample";
    case CARLS__REQUEST__OP_FEATURE_GET: return "feature_get";
    case CARLS__REQUEST__OP_FEATURE_PUT: return "feature_put";
    case CARLS__REQUEST__OP_SCAN: return "scan";
    case CARLS__REQUEST__OP_IMPORT_ROWS: return "import_rows";
    case CARLS__REQUEST__OP_SNAPSHOT: return "snapshot";
    case CARLS__REQUEST__OP_REPLICA: return "replica";
    default: return "none";
    }
}

bool carls_table_name_valid(const char *name)
{
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n > CARLS_MAX_TABLE_NAME_BYTES)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                 c == '-' || c == '.';
        if (!ok)
            return false;
    }
    return true;
}

uint32_t carls_shard_of(const void *key, size_t len, uint32_t n)
{
    if (n <= 1)
        return 0;
    /* A seed of its own so shard placement is independent of the row maps' and stripes' hashing. */
    return (uint32_t)(carls_hash64(key, len, 0x7368617264ULL) % n);
}

/* Reads a base-128 varint at *p (at most 10 bytes, not past end); false if it is cut short. */
static bool s_varint(const uint8_t **p, const uint8_t *end, uint64_t *out)
{
    uint64_t v = 0;
    for (unsigned shift = 0; shift < 70 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return true;
        }
    }
    return false;
}

Carls__Request__OpCase carls_request_peek_op(const uint8_t *frame, size_t len)
{
    const uint8_t *p = frame, *end = frame + len;
    while (p < end) {
        uint64_t tag, skip = 0;
        if (!s_varint(&p, end, &tag))
            break;
        uint64_t field = tag >> 3;
        if (field == CARLS__REQUEST__OP_SNAPSHOT || field == CARLS__REQUEST__OP_REPLICA)
            return (Carls__Request__OpCase)field;
        if (field >= CARLS__REQUEST__OP_CREATE_TABLE && field <= CARLS__REQUEST__OP_SCAN)
            return (Carls__Request__OpCase)field;
        switch (tag & 7) {
        case 0: /* varint */
            if (!s_varint(&p, end, &skip))
                return CARLS__REQUEST__OP__NOT_SET;
            skip = 0;
            break;
        case 1: skip = 8; break;
        case 2: /* length-delimited */
            if (!s_varint(&p, end, &skip))
                return CARLS__REQUEST__OP__NOT_SET;
            break;
        case 5: skip = 4; break;
        default: return CARLS__REQUEST__OP__NOT_SET;
        }
        if (skip > (uint64_t)(end - p))
            break;
        p += skip;
    }
    return CARLS__REQUEST__OP__NOT_SET;
}

carls_enum_name_t carls_enum_name(const ProtobufCEnumValue *v)
{
    carls_enum_name_t out;
    const char *p = strchr(v->name, '_');
    p = p ? p + 1 : v->name;
    size_t i = 0;
    for (; p[i] && i + 1 < sizeof out.text; i++)
        out.text[i] = p[i] == '_' ? '-' : (char)tolower((unsigned char)p[i]);
    out.text[i] = '\0';
    return out;
}

carls_enum_name_t carls_enum_name_of(const ProtobufCEnumDescriptor *names, int value)
{
    const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(names, value);
    return v ? carls_enum_name(v) : (carls_enum_name_t){"unknown"};
}

int carls_enum_parse(const ProtobufCEnumDescriptor *names, const char *text, int *out)
{
    for (unsigned i = 0; i < names->n_values; i++) {
        if (strcmp(carls_enum_name(&names->values[i]).text, text) == 0) {
            *out = names->values[i].value;
            return 0;
        }
    }
    return -1;
}
