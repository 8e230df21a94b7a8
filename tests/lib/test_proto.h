/* Builders of protocol messages that several test programs fill the same way. */
#ifndef CARLS_TEST_PROTO_H
#define CARLS_TEST_PROTO_H

#include "carls.pb-c.h"

#include <stddef.h>

/* Points rec's neighbour keys and weights at keys and weights, n of each (the caller keeps them alive). */
void test_record_neighbors(Carls__FeatureRecord *rec, ProtobufCBinaryData *keys, float *weights, size_t n);

/* Makes req a put of n_keys keys with their values (n_values floats, all rows); put is the caller's storage
 * for the payload. The envelope (table, ids) is left as it is. */
void test_put_request(Carls__Request *req, Carls__Put *put, ProtobufCBinaryData *keys, size_t n_keys, float *values,
                      size_t n_values);

#endif
