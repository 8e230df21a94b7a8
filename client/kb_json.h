/* Protobuf messages as JSON text, walked through their protobuf-c descriptors, so a field added to carls.proto
 * shows without an edit here. For callers that read answers as text: the shared client library's
 * kb_ffi_*_json calls, which the Python package parses with its json module.
 *
 * The text: one object per message, fields in carls.proto's order under their proto names. Scalars and
 * enums of proto3 (no presence) are always written; a message field left NULL and a oneof member that is
 * not the one set are left out; repeated fields are arrays. Integers (64-bit ones too) are JSON numbers;
 * floats are written with 9 significant digits, doubles with 17 (both read back exactly), NaN and
 * infinities as NaN, Infinity, -Infinity (which Python's json reads). Enums are their names as
 * carls_enum_name writes them ("sgd", "norm-median"). Strings are escaped for JSON. Bytes are strings of one
 * character per byte: printable ASCII as itself, every other byte as \u00XX, so a reader gets the bytes
 * back by encoding the string as Latin-1. */
#ifndef KB_JSON_H
#define KB_JSON_H

#include <protobuf-c/protobuf-c.h>

#include <stdbool.h>
#include <stddef.h>

/* A growing NUL-terminated text: len bytes in an allocation of cap (text may be NULL with len == cap == 0;
 * free(text) when done). */
typedef struct {
    char *text;
    size_t len;
    size_t cap;
} kb_json_t;

/* Appends msg as a JSON object. Aborts with file:line when out of memory. */
void kb_json_message(kb_json_t *out, const ProtobufCMessage *msg);

/* Appends len bytes of s as a JSON string (escaped as above; as_bytes selects the bytes rule, which escapes
 * every byte outside printable ASCII, over the string rule, which copies bytes >= 0x80 as they are). */
void kb_json_string(kb_json_t *out, const void *s, size_t len, bool as_bytes);

/* Appends the NUL-terminated text as it is (punctuation between values: "[", ",", "]"). */
void kb_json_raw(kb_json_t *out, const char *text);

#endif
