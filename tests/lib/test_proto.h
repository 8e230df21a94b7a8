/* Builders of protocol messages that several test programs fill the same way. */
#ifndef CARLS_TEST_PROTO_H
#define CARLS_TEST_PROTO_H

#include "carls.pb-c.h"

#include <stddef.h>
#include <stdint.h>

/* A table's config with its optimizer and lazy-update parts, which cfg points to: pass &cfg, and do not copy
 * the struct (the copy's cfg would still point into the original). */
typedef struct {
    Carls__TableConfig cfg;
    Carls__OptimizerConfig opt;
    Carls__LazyUpdateConfig lazy;
} test_table_config_t;

/* Fills t with an embedding table's config: width dim, initial values of init (seed), optimizer opt_kind
 * at learning_rate, update policy; every other field is the protocol's zero (the server's default). Returns
 * &t->cfg. A test that wants more (max_pending, outlier rule, knn...) sets those fields on t afterwards. */
Carls__TableConfig *test_embedding_table_config(test_table_config_t *t, uint32_t dim, Carls__InitKind init,
                                                uint64_t init_seed, Carls__OptimizerKind opt_kind,
                                                float learning_rate, Carls__UpdatePolicy policy);

/* An embedding table's config of width dim with a knn index (spec, metric); knn is the caller's storage for
 * the index part, which the config points to. */
Carls__TableConfig test_knn_table_config(Carls__KnnConfig *knn, uint32_t dim, const char *spec,
                                         Carls__KnnMetric metric);

/* Points rec's neighbour keys and weights at keys and weights, n of each (the caller keeps them alive). */
void test_record_neighbors(Carls__FeatureRecord *rec, ProtobufCBinaryData *keys, float *weights, size_t n);

/* Fills req's envelope: this build's protocol version, request_id, the writer (client_id and its sequence, by
 * which the server knows a resent write) and the table. The op is left as it is. */
void test_request_envelope(Carls__Request *req, const char *table, uint64_t request_id, uint64_t client_id,
                           uint64_t sequence);

/* Makes req a put of n_keys keys with their values (n_values floats, all rows); put is the caller's storage
 * for the payload. The envelope (table, ids) is left as it is. */
void test_put_request(Carls__Request *req, Carls__Put *put, ProtobufCBinaryData *keys, size_t n_keys, float *values,
                      size_t n_values);

/* Makes req a feature_put of n keys with one record each (fp is the caller's storage for the payload), or a
 * feature_get of n keys (fg likewise). The envelope (table, ids) is left as it is. */
void test_feature_put_request(Carls__Request *req, Carls__FeaturePut *fp, ProtobufCBinaryData *keys,
                              Carls__FeatureRecord **records, size_t n);
void test_feature_get_request(Carls__Request *req, Carls__FeatureGet *fg, ProtobufCBinaryData *keys, size_t n);

#endif
