/* Builders of protocol messages for the tests (see test_proto.h). */
#include "test_proto.h"

void test_record_neighbors(Carls__FeatureRecord *rec, ProtobufCBinaryData *keys, float *weights, size_t n)
{
    rec->neighbor_keys = keys;
    rec->n_neighbor_keys = n;
    rec->neighbor_weights = weights;
    rec->n_neighbor_weights = n;
}
