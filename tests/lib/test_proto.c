/* Builders of protocol messages for the tests (see test_proto.h). */
#include "test_proto.h"

#include "protocol.h"

Carls__TableConfig *test_embedding_table_config(test_table_config_t *t, uint32_t dim, Carls__InitKind init,
                                                uint64_t init_seed, Carls__OptimizerKind opt_kind,
                                                float learning_rate, Carls__UpdatePolicy policy)
{
    carls__table_config__init(&t->cfg);
    carls__optimizer_config__init(&t->opt);
    carls__lazy_update_config__init(&t->lazy);
    t->cfg.dim = dim;
    t->cfg.init = init;
    t->cfg.init_seed = init_seed;
    t->opt.kind = opt_kind;
    t->opt.learning_rate = learning_rate;
    t->lazy.policy = policy;
    t->cfg.optimizer = &t->opt;
    t->cfg.lazy = &t->lazy;
    return &t->cfg;
}

Carls__TableConfig test_knn_table_config(Carls__KnnConfig *knn, uint32_t dim, const char *spec,
                                         Carls__KnnMetric metric)
{
    carls__knn_config__init(knn);
    knn->spec = (char *)spec;
    knn->metric = metric;
    Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
    cfg.dim = dim;
    cfg.knn = knn;
    return cfg;
}

void test_request_envelope(Carls__Request *req, const char *table, uint64_t request_id, uint64_t client_id,
                           uint64_t sequence)
{
    req->protocol_version = CARLS_PROTOCOL_VERSION;
    req->request_id = request_id;
    req->client_id = client_id;
    req->sequence = sequence;
    req->table = (char *)table;
}

void test_put_request(Carls__Request *req, Carls__Put *put, ProtobufCBinaryData *keys, size_t n_keys, float *values,
                      size_t n_values)
{
    put->keys = keys;
    put->n_keys = n_keys;
    put->values = values;
    put->n_values = n_values;
    req->op_case = CARLS__REQUEST__OP_PUT;
    req->put = put;
}

void test_feature_put_request(Carls__Request *req, Carls__FeaturePut *fp, ProtobufCBinaryData *keys,
                              Carls__FeatureRecord **records, size_t n)
{
    carls__feature_put__init(fp);
    fp->keys = keys;
    fp->records = records;
    fp->n_keys = fp->n_records = n; /* one record per key */
    req->op_case = CARLS__REQUEST__OP_FEATURE_PUT;
    req->feature_put = fp;
}

void test_feature_get_request(Carls__Request *req, Carls__FeatureGet *fg, ProtobufCBinaryData *keys, size_t n)
{
    carls__feature_get__init(fg);
    fg->keys = keys;
    fg->n_keys = n;
    req->op_case = CARLS__REQUEST__OP_FEATURE_GET;
    req->feature_get = fg;
}

void test_record_neighbors(Carls__FeatureRecord *rec, ProtobufCBinaryData *keys, float *weights, size_t n)
{
    rec->neighbor_keys = keys;
    rec->n_neighbor_keys = n;
    rec->neighbor_weights = weights;
    rec->n_neighbor_weights = n;
}
