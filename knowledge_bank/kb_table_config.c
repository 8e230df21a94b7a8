#include "kb_table_config.h"

#include "protocol.h"

#include <stdio.h>
#include <string.h>

/* The two names of one limit: the wire's (clients check it) and the table's (kb_table_config_finish does). */
_Static_assert(CARLS_MAX_PENDING_LIMIT == KB_TABLE_MAX_PENDING, "max_pending limits differ");

/* Admission and eviction, shared by both table kinds. Values are copied only for a policy other than the
 * default, so an unused field of the wire never reaches the config (which is compared with memcmp). */
static int s_memory_policies_from_proto(const Carls__TableConfig *in, kb_table_config_t *out, char *err,
                                        size_t errlen)
{
    const Carls__AdmissionConfig *a = in->admission;
    if (a && a->kind != CARLS__ADMISSION_KIND__ADMIT_ALL) {
        if (a->kind == CARLS__ADMISSION_KIND__ADMIT_FREQUENCY)
            out->admission = KB_ADMIT_FREQUENCY;
        else if (a->kind == CARLS__ADMISSION_KIND__ADMIT_BLOOM)
            out->admission = KB_ADMIT_BLOOM;
        else {
            snprintf(err, errlen, "unknown admission kind %d", (int)a->kind);
            return -1;
        }
        out->min_frequency = a->min_frequency;
        out->bloom_bits_log2 = a->bloom_bits_log2;
        out->bloom_hashes = a->bloom_hashes;
    }
    const Carls__EvictionConfig *e = in->eviction;
    if (e && e->kind != CARLS__EVICTION_KIND__EVICT_NONE) {
        if (e->kind == CARLS__EVICTION_KIND__EVICT_LRU)
            out->eviction = KB_EVICT_LRU;
        else if (e->kind == CARLS__EVICTION_KIND__EVICT_OLDEST)
            out->eviction = KB_EVICT_OLDEST;
        else {
            snprintf(err, errlen, "unknown eviction kind %d", (int)e->kind);
            return -1;
        }
        out->max_rows = e->max_rows;
    }
    return 0;
}

/* The fields only embedding tables have: initializer, optimizer, lazy update and knn index. An absent
 * nested message reads as all zeros (the defaults; OPT_SGD, UPDATE_LAZY, OUTLIER_NORM_MEDIAN are 0). */
static int s_embedding_from_proto(const Carls__TableConfig *in, kb_table_config_t *out, char *err, size_t errlen)
{
    switch (in->init) {
    case CARLS__INIT_KIND__INIT_ZEROS: out->init = KB_INIT_ZEROS; break;
    case CARLS__INIT_KIND__INIT_UNIFORM: out->init = KB_INIT_UNIFORM; break;
    case CARLS__INIT_KIND__INIT_NORMAL: out->init = KB_INIT_NORMAL; break;
    default: snprintf(err, errlen, "unknown initializer %d", (int)in->init); return -1;
    }
    out->init_scale = in->init_scale;
    out->init_seed = in->init_seed;

    const Carls__OptimizerConfig *opt = in->optimizer;
    if (opt) {
        switch (opt->kind) {
        case CARLS__OPTIMIZER_KIND__OPT_SGD: out->optimizer.kind = KB_OPT_SGD; break;
        case CARLS__OPTIMIZER_KIND__OPT_MOMENTUM: out->optimizer.kind = KB_OPT_MOMENTUM; break;
        case CARLS__OPTIMIZER_KIND__OPT_ADAGRAD: out->optimizer.kind = KB_OPT_ADAGRAD; break;
        case CARLS__OPTIMIZER_KIND__OPT_ADAM: out->optimizer.kind = KB_OPT_ADAM; break;
        default: snprintf(err, errlen, "unknown optimizer %d", (int)opt->kind); return -1;
        }
        out->optimizer.learning_rate = opt->learning_rate;
        out->optimizer.momentum = opt->momentum;
        out->optimizer.beta1 = opt->beta1;
        out->optimizer.beta2 = opt->beta2;
        out->optimizer.epsilon = opt->epsilon;
        out->optimizer.initial_accumulator = opt->initial_accumulator;
    }

    const Carls__LazyUpdateConfig *lazy = in->lazy;
    if (lazy) {
        if (lazy->policy == CARLS__UPDATE_POLICY__UPDATE_IMMEDIATE)
            out->immediate = true;
        else if (lazy->policy != CARLS__UPDATE_POLICY__UPDATE_LAZY) {
            snprintf(err, errlen, "unknown update policy %d", (int)lazy->policy);
            return -1;
        }
        if (lazy->outlier_rule == CARLS__OUTLIER_RULE__OUTLIER_NONE)
            out->outlier.rule = KB_OUTLIER_NONE;
        else if (lazy->outlier_rule != CARLS__OUTLIER_RULE__OUTLIER_NORM_MEDIAN) {
            snprintf(err, errlen, "unknown outlier rule %d", (int)lazy->outlier_rule);
            return -1;
        }
        out->max_age_ms = lazy->max_age_ms;
        out->max_pending = lazy->max_pending;
        out->outlier.threshold = lazy->outlier_threshold;
        out->outlier.min_count = lazy->outlier_min_count;
    }

    const Carls__KnnConfig *k = in->knn;
    if (k && k->spec && k->spec[0]) { /* an empty spec: no index */
        if (strlen(k->spec) >= KB_KNN_SPEC_MAX) {
            snprintf(err, errlen, "knn spec longer than %d characters", KB_KNN_SPEC_MAX - 1);
            return -1;
        }
        switch (k->metric) {
        case CARLS__KNN_METRIC__METRIC_IP: out->knn_metric = KB_KNN_METRIC_IP; break;
        case CARLS__KNN_METRIC__METRIC_L2: out->knn_metric = KB_KNN_METRIC_L2; break;
        case CARLS__KNN_METRIC__METRIC_COSINE: out->knn_metric = KB_KNN_METRIC_COSINE; break;
        default: snprintf(err, errlen, "unknown knn metric %d", (int)k->metric); return -1;
        }
        out->knn = true;
        snprintf(out->knn_spec, sizeof out->knn_spec, "%s", k->spec);
        out->knn_nprobe = k->nprobe;
        out->knn_ef_search = k->ef_search;
    }
    return 0;
}

int kb_table_config_from_proto(const Carls__TableConfig *in, uint32_t max_dim, kb_table_config_t *out, char *err,
                               size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (!in) {
        snprintf(err, errlen, "missing table config");
        return -1;
    }
    out->dim = in->dim;
    if (in->kind == CARLS__TABLE_KIND__TABLE_FEATURE) {
        out->kind = KB_TABLE_FEATURE;
        out->knn = in->knn != NULL; /* any knn message, even empty: refused by kb_table_config_finish */
    } else if (in->kind == CARLS__TABLE_KIND__TABLE_EMBEDDING) {
        out->kind = KB_TABLE_EMBEDDING;
        if (s_embedding_from_proto(in, out, err, errlen) != 0)
            return -1;
    } else {
        snprintf(err, errlen, "unknown table kind %d", (int)in->kind);
        return -1;
    }
    if (s_memory_policies_from_proto(in, out, err, errlen) != 0)
        return -1;
    return kb_table_config_finish(out, max_dim, err, errlen);
}

/* kb_table_config_to_proto casts these enums: the table's values are the wire's. */
_Static_assert((int)KB_INIT_ZEROS == CARLS__INIT_KIND__INIT_ZEROS &&
                   (int)KB_INIT_UNIFORM == CARLS__INIT_KIND__INIT_UNIFORM &&
                   (int)KB_INIT_NORMAL == CARLS__INIT_KIND__INIT_NORMAL,
               "init kinds differ");
_Static_assert((int)KB_OPT_SGD == CARLS__OPTIMIZER_KIND__OPT_SGD &&
                   (int)KB_OPT_MOMENTUM == CARLS__OPTIMIZER_KIND__OPT_MOMENTUM &&
                   (int)KB_OPT_ADAGRAD == CARLS__OPTIMIZER_KIND__OPT_ADAGRAD &&
                   (int)KB_OPT_ADAM == CARLS__OPTIMIZER_KIND__OPT_ADAM,
               "optimizer kinds differ");
_Static_assert((int)KB_KNN_METRIC_IP == CARLS__KNN_METRIC__METRIC_IP &&
                   (int)KB_KNN_METRIC_L2 == CARLS__KNN_METRIC__METRIC_L2 &&
                   (int)KB_KNN_METRIC_COSINE == CARLS__KNN_METRIC__METRIC_COSINE,
               "knn metrics differ");

void kb_table_config_to_proto(const kb_table_config_t *in, kb_table_config_wire_t *w)
{
    Carls__TableConfig *out = &w->config;
    carls__table_config__init(out);
    carls__optimizer_config__init(&w->optimizer);
    carls__lazy_update_config__init(&w->lazy);
    carls__knn_config__init(&w->knn);
    carls__admission_config__init(&w->admission);
    carls__eviction_config__init(&w->eviction);
    out->kind = in->kind == KB_TABLE_FEATURE ? CARLS__TABLE_KIND__TABLE_FEATURE : CARLS__TABLE_KIND__TABLE_EMBEDDING;
    out->dim = in->dim;
    if (in->admission != KB_ADMIT_ALL) {
        w->admission.kind = in->admission == KB_ADMIT_BLOOM ? CARLS__ADMISSION_KIND__ADMIT_BLOOM
                                                            : CARLS__ADMISSION_KIND__ADMIT_FREQUENCY;
        w->admission.min_frequency = in->min_frequency;
        w->admission.bloom_bits_log2 = in->bloom_bits_log2;
        w->admission.bloom_hashes = in->bloom_hashes;
        out->admission = &w->admission;
    }
    if (in->eviction != KB_EVICT_NONE) {
        w->eviction.kind = in->eviction == KB_EVICT_LRU ? CARLS__EVICTION_KIND__EVICT_LRU
                                                        : CARLS__EVICTION_KIND__EVICT_OLDEST;
        w->eviction.max_rows = in->max_rows;
        out->eviction = &w->eviction;
    }
    if (in->kind == KB_TABLE_FEATURE)
        return;
    out->init = (Carls__InitKind)in->init;
    out->init_scale = in->init_scale;
    out->init_seed = in->init_seed;
    Carls__OptimizerConfig *opt = &w->optimizer;
    opt->kind = (Carls__OptimizerKind)in->optimizer.kind;
    opt->learning_rate = in->optimizer.learning_rate;
    opt->momentum = in->optimizer.momentum;
    opt->beta1 = in->optimizer.beta1;
    opt->beta2 = in->optimizer.beta2;
    opt->epsilon = in->optimizer.epsilon;
    opt->initial_accumulator = in->optimizer.initial_accumulator;
    Carls__LazyUpdateConfig *lazy = &w->lazy;
    lazy->policy = in->immediate ? CARLS__UPDATE_POLICY__UPDATE_IMMEDIATE : CARLS__UPDATE_POLICY__UPDATE_LAZY;
    lazy->max_age_ms = in->max_age_ms;
    lazy->max_pending = in->max_pending;
    lazy->outlier_rule = in->outlier.rule == KB_OUTLIER_NONE ? CARLS__OUTLIER_RULE__OUTLIER_NONE
                                                             : CARLS__OUTLIER_RULE__OUTLIER_NORM_MEDIAN;
    lazy->outlier_threshold = in->outlier.threshold;
    lazy->outlier_min_count = in->outlier.min_count;
    out->optimizer = opt;
    out->lazy = lazy;
    if (in->knn) {
        w->knn.spec = (char *)in->knn_spec;
        w->knn.metric = (Carls__KnnMetric)in->knn_metric;
        w->knn.nprobe = in->knn_nprobe;
        w->knn.ef_search = in->knn_ef_search;
        out->knn = &w->knn;
    }
}

uint8_t *kb_table_config_pack(const kb_table_config_t *cfg, size_t *len)
{
    kb_table_config_wire_t wire;
    kb_table_config_to_proto(cfg, &wire);
    *len = carls__table_config__get_packed_size(&wire.config);
    uint8_t *buf = carls_xmalloc(*len ? *len : 1);
    carls__table_config__pack(&wire.config, buf);
    return buf;
}

int kb_table_config_unpack(const uint8_t *bytes, size_t len, kb_table_config_t *out, char *err, size_t errlen)
{
    Carls__TableConfig *pc = carls__table_config__unpack(NULL, len, bytes);
    if (!pc) {
        memset(out, 0, sizeof *out);
        snprintf(err, errlen, "undecodable table config");
        return -1;
    }
    int rc = kb_table_config_from_proto(pc, CARLS_DEFAULT_MAX_DIM, out, err, errlen);
    carls__table_config__free_unpacked(pc, NULL);
    return rc;
}
