/* Protobuf messages as JSON text (kb_json.h). */
#include "kb_json.h"

#include "protocol.h"
#include "util.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* Makes room for need more bytes plus the terminating NUL. */
static void s_reserve(kb_json_t *out, size_t need)
{
    out->text = carls_grow(out->text, &out->cap, out->len + need + 1, 1);
}

static void s_append(kb_json_t *out, const char *s, size_t len)
{
    s_reserve(out, len);
    memcpy(out->text + out->len, s, len);
    out->len += len;
    out->text[out->len] = '\0';
}

void kb_json_raw(kb_json_t *out, const char *text)
{
    s_append(out, text, strlen(text));
}

static void s_printf(kb_json_t *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void s_printf(kb_json_t *out, const char *fmt, ...)
{
    char buf[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    s_append(out, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
}

void kb_json_string(kb_json_t *out, const void *s, size_t len, bool as_bytes)
{
    const unsigned char *p = s;
    s_reserve(out, len * 6 + 2); /* the longest escape, \u00XX, is 6 bytes */
    char *w = out->text + out->len;
    *w++ = '"';
    for (size_t i = 0; i < len; i++) {
        unsigned char c = p[i];
        if (c == '"' || c == '\\') {
            *w++ = '\\';
            *w++ = (char)c;
        } else if (c < 0x20 || c == 0x7f || (as_bytes && c >= 0x80)) {
            static const char hex[] = "0123456789abcdef";
            memcpy(w, "\\u00", 4);
            w[4] = hex[c >> 4];
            w[5] = hex[c & 15];
            w += 6;
        } else {
            *w++ = (char)c;
        }
    }
    *w++ = '"';
    out->len = (size_t)(w - out->text);
    out->text[out->len] = '\0';
}

static void s_real(kb_json_t *out, double v, int digits)
{
    if (isnan(v))
        kb_json_raw(out, "NaN");
    else if (isinf(v))
        kb_json_raw(out, v > 0 ? "Infinity" : "-Infinity");
    else
        s_printf(out, "%.*g", digits, v);
}

/* Size in a repeated field's array of one element of type t. */
static size_t s_elem_size(ProtobufCType t)
{
    switch (t) {
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_DOUBLE:
        return 8;
    case PROTOBUF_C_TYPE_STRING:
    case PROTOBUF_C_TYPE_MESSAGE:
        return sizeof(void *);
    case PROTOBUF_C_TYPE_BYTES:
        return sizeof(ProtobufCBinaryData);
    case PROTOBUF_C_TYPE_BOOL:
        return sizeof(protobuf_c_boolean);
    default: /* 32-bit integers, float, enum */
        return 4;
    }
}

/* One value of field f stored at p. */
static void s_value(kb_json_t *out, const ProtobufCFieldDescriptor *f, const void *p)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
        s_printf(out, "%" PRId32, *(const int32_t *)p);
        break;
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        s_printf(out, "%" PRIu32, *(const uint32_t *)p);
        break;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
        s_printf(out, "%" PRId64, *(const int64_t *)p);
        break;
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        s_printf(out, "%" PRIu64, *(const uint64_t *)p);
        break;
    case PROTOBUF_C_TYPE_FLOAT:
        s_real(out, *(const float *)p, 9);
        break;
    case PROTOBUF_C_TYPE_DOUBLE:
        s_real(out, *(const double *)p, 17);
        break;
    case PROTOBUF_C_TYPE_BOOL:
        kb_json_raw(out, *(const protobuf_c_boolean *)p ? "true" : "false");
        break;
    case PROTOBUF_C_TYPE_ENUM: {
        int v = *(const int *)p;
        const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(f->descriptor, v);
        if (ev) {
            carls_enum_name_t name = carls_enum_name(ev);
            kb_json_string(out, name.text, strlen(name.text), false);
        } else {
            s_printf(out, "%d", v); /* a value this build does not know: its number */
        }
        break;
    }
    case PROTOBUF_C_TYPE_STRING: {
        const char *s = *(char *const *)p;
        kb_json_string(out, s ? s : "", s ? strlen(s) : 0, false);
        break;
    }
    case PROTOBUF_C_TYPE_BYTES: {
        const ProtobufCBinaryData *b = p;
        kb_json_string(out, b->data, b->len, true);
        break;
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessage *m = *(const ProtobufCMessage *const *)p;
        if (m)
            kb_json_message(out, m);
        else
            kb_json_raw(out, "null");
        break;
    }
    }
}

void kb_json_message(kb_json_t *out, const ProtobufCMessage *msg)
{
    const ProtobufCMessageDescriptor *d = msg->descriptor;
    const char *base = (const char *)msg;
    bool first = true;
    kb_json_raw(out, "{");
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        const void *p = base + f->offset;
        if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
            if (*(const uint32_t *)(base + f->quantifier_offset) != f->id)
                continue;
        } else if (f->label == PROTOBUF_C_LABEL_OPTIONAL && f->type != PROTOBUF_C_TYPE_MESSAGE &&
                   f->type != PROTOBUF_C_TYPE_STRING) {
            if (!*(const protobuf_c_boolean *)(base + f->quantifier_offset))
                continue;
        }
        if (f->type == PROTOBUF_C_TYPE_MESSAGE && f->label != PROTOBUF_C_LABEL_REPEATED &&
            !*(const ProtobufCMessage *const *)p)
            continue;
        if (!first)
            kb_json_raw(out, ",");
        first = false;
        kb_json_string(out, f->name, strlen(f->name), false);
        kb_json_raw(out, ":");
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)(base + f->quantifier_offset);
            const char *arr = *(const char *const *)p;
            size_t size = s_elem_size(f->type);
            kb_json_raw(out, "[");
            for (size_t j = 0; j < n; j++) {
                if (j)
                    kb_json_raw(out, ",");
                s_value(out, f, arr + j * size);
            }
            kb_json_raw(out, "]");
        } else {
            s_value(out, f, p);
        }
    }
    kb_json_raw(out, "}");
}
