#include "kb_table_config.h"

#include "protocol.h"

#include <stdio.h>
#include <string.h>

/* The two names of one limit: the wire's (clients check it) and the table's (kb_table_config_finish does). */
_Static_assert(CARLS_MAX_PENDING_LIMIT == KB_TABLE_MAX_PENDING, "max_pending limits differ");

/* The table's enums number their values as carls.proto does, so a wire value in range is cast, both ways. */
_Static_assert((int)KB_TABLE_EMBEDDING == CARLS__TABLE_KIND__TABLE_EMBEDDING &&
                   (int)KB_TABLE_FEATURE == CARLS__TABLE_KIND__TABLE_FEATURE,
               "table kinds differ");
_Static_assert((int)KB_INIT_ZEROS == CARLS__INIT_KIND__INIT_ZEROS &&
                   (int)KB_INIT_UNIFORM == CARLS__INIT_KIND__INIT_UNIFORM &&
                   (int)KB_INIT_NORMAL == CARLS__INIT_KIND__INIT_NORMAL,
               "init kinds differ");
_Static_assert((int)KB_OPT_SGD == CARLS__OPTIMIZER_KIND__OPT_SGD &&
                   (int)KB_OPT_MOMENTUM == CARLS__OPTIMIZER_KIND__OPT_MOMENTUM &&
                   (int)KB_OPT_ADAGRAD == CARLS__OPTIMIZER_KIND__OPT_ADAGRAD &&
                   (int)KB_OPT_ADAM == CARLS__OPTIMIZER_KIND__OPT_ADAM,
               "optimizer kinds differ");
_Static_assert((int)KB_OUTLIER_NORM_MEDIAN == CARLS__OUTLIER_RULE__OUTLIER_NORM_MEDIAN &&
                   (int)KB_OUTLIER_NONE == CARLS__OUTLIER_RULE__OUTLIER_NONE,
               "outlier rules differ");
_Static_assert((int)KB_KNN_METRIC_IP == CARLS__KNN_METRIC__METRIC_IP &&
                   (int)KB_KNN_METRIC_L2 == CARLS__KNN_METRIC__METRIC_L2 &&
                   (int)KB_KNN_METRIC_COSINE == CARLS__KNN_METRIC__METRIC_COSINE,
               "knn metrics differ");
_Static_assert((int)KB_ADMIT_ALL == CARLS__ADMISSION_KIND__ADMIT_ALL &&
                   (int)KB_ADMIT_FREQUENCY == CARLS__ADMISSION_KIND__ADMIT_FREQUENCY &&
                   (int)KB_ADMIT_BLOOM == CARLS__ADMISSION_KIND__ADMIT_BLOOM,
               "admission kinds differ");
_Static_assert((int)KB_EVICT_NONE == CARLS__EVICTION_KIND__EVICT_NONE &&
                   (int)KB_EVICT_LRU == CARLS__EVICTION_KIND__EVICT_LRU &&
                   (int)KB_EVICT_OLDEST == CARLS__EVICTION_KIND__EVICT_OLDEST,
               "eviction kinds differ");

/* 0 when a wire enum value is one of 0..last; else -1 with "unknown <what> <value>" in err (a peer may send any
 * number). */
static int s_known(int value, int last, const char *what, char *err, size_t errlen)
{
    if (value >= 0 && value <= last)
        return 0;
    snprintf(err, errlen, "unknown %s %d", what, value);
    return -1;
}

/* Admission and eviction, shared by both table kinds. Values are copied only for a policy other than the
 * default, so an unused field of the wire never reaches the config (which is compared with memcmp). */
static int s_memory_policies_from_proto(const Carls__TableConfig *in, kb_table_config_t *out, char *err,
                                        size_t errlen)
{
    const Carls__AdmissionConfig *a = in->admission;
    if (a && a->kind != CARLS__ADMISSION_KIND__ADMIT_ALL) {
        if (s_known((int)a->kind, KB_ADMIT_BLOOM, "admission kind", err, errlen) != 0)
            return -1;
        out->admission = (kb_admission_kind_t)a->kind;
        out->min_frequency = a->min_frequency;
        out->bloom_bits_log2 = a->bloom_bits_log2;
        out->bloom_hashes = a->bloom_hashes;
    }
    const Carls__EvictionConfig *e = in->eviction;
    if (e && e->kind != CARLS__EVICTION_KIND__EVICT_NONE) {
        if (s_known((int)e->kind, KB_EVICT_OLDEST, "eviction kind", err, errlen) != 0)
            return -1;
        out->eviction = (kb_eviction_kind_t)e->kind;
        out->max_rows = e->max_rows;
    }
    return 0;
}

/* The fields only embedding tables have: initializer, optimizer, lazy update and knn index. An absent
 * nested message reads as all zeros (the defaults; OPT_SGD, UPDATE_LAZY, OUTLIER_NORM_MEDIAN are 0). */
static int s_embedding_from_proto(const Carls__TableConfig *in, kb_table_config_t *out, char *err, size_t errlen)
{
    if (s_known((int)in->init, KB_INIT_NORMAL, "initializer", err, errlen) != 0)
        return -1;
    out->init = (kb_init_kind_t)in->init;
    out->init_scale = in->init_scale;
    out->init_seed = in->init_seed;

    const Carls__OptimizerConfig *opt = in->optimizer;
    if (opt) {
        if (s_known((int)opt->kind, KB_OPT_ADAM, "optimizer", err, errlen) != 0)
            return -1;
        out->optimizer.kind = (kb_optimizer_kind_t)opt->kind;
        out->optimizer.learning_rate = opt->learning_rate;
        out->optimizer.momentum = opt->momentum;
        out->optimizer.beta1 = opt->beta1;
        out->optimizer.beta2 = opt->beta2;
        out->optimizer.epsilon = opt->epsilon;
        out->optimizer.initial_accumulator = opt->initial_accumulator;
    }

    const Carls__LazyUpdateConfig *lazy = in->lazy;
    if (lazy) {
        if (s_known((int)lazy->policy, CARLS__UPDATE_POLICY__UPDATE_IMMEDIATE, "update policy", err, errlen) != 0 ||
            s_known((int)lazy->outlier_rule, KB_OUTLIER_NONE, "outlier rule", err, errlen) != 0)
            return -1;
        out->immediate = lazy->policy == CARLS__UPDATE_POLICY__UPDATE_IMMEDIATE;
        out->outlier.rule = (kb_outlier_rule_t)lazy->outlier_rule;
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
        if (s_known((int)k->metric, KB_KNN_METRIC_COSINE, "knn metric", err, errlen) != 0)
            return -1;
        out->knn = true;
        out->knn_metric = (kb_knn_metric_t)k->metric;
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
    if (s_known((int)in->kind, KB_TABLE_FEATURE, "table kind", err, errlen) != 0)
        return -1;
    out->kind = (kb_table_kind_t)in->kind;
    out->dim = in->dim;
    if (out->kind == KB_TABLE_FEATURE)
        out->knn = in->knn != NULL; /* any knn message, even empty: refused by kb_table_config_finish */
    else if (s_embedding_from_proto(in, out, err, errlen) != 0)
        return -1;
    if (s_memory_policies_from_proto(in, out, err, errlen) != 0)
        return -1;
    return kb_table_config_finish(out, max_dim, err, errlen);
}

void kb_table_config_to_proto(const kb_table_config_t *in, kb_table_config_wire_t *w)
{
    Carls__TableConfig *out = &w->config;
    carls__table_config__init(out);
    carls__optimizer_config__init(&w->optimizer);
    carls__lazy_update_config__init(&w->lazy);
    carls__knn_config__init(&w->knn);
    carls__admission_config__init(&w->admission);
    carls__eviction_config__init(&w->eviction);
    out->kind = (Carls__TableKind)in->kind;
    out->dim = in->dim;
    if (in->admission != KB_ADMIT_ALL) {
        w->admission.kind = (Carls__AdmissionKind)in->admission;
        w->admission.min_frequency = in->min_frequency;
        w->admission.bloom_bits_log2 = in->bloom_bits_log2;
        w->admission.bloom_hashes = in->bloom_hashes;
        out->admission = &w->admission;
    }
    if (in->eviction != KB_EVICT_NONE) {
        w->eviction.kind = (Carls__EvictionKind)in->eviction;
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
    lazy->outlier_rule = (Carls__OutlierRule)in->outlier.rule;
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
