/* Builders of protocol messages that several test programs fill the same way. */
#ifndef CARLS_TEST_PROTO_H
#define CARLS_TEST_PROTO_H

#include "carls.pb-c.h"

#include <stddef.h>

/* Points rec's neighbour keys and weights at keys and weights, n of each (the caller keeps them alive). */
void test_record_neighbors(Carls__FeatureRecord *rec, ProtobufCBinaryData *keys, float *weights, size_t n);

#endif
