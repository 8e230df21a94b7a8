#include "kb_table_config.h"

#include "kb_knn.h"
#include "protocol.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Defaults for fields left zero on the wire (documented in proto/carls.proto and docs/PROTOCOL.md). */
#define DEFAULT_INIT_SCALE 0.05f
#define DEFAULT_MAX_AGE_MS 1000u
#define DEFAULT_MAX_PENDING 16u
#define DEFAULT_OUTLIER_THRESHOLD 3.0f
#define DEFAULT_OUTLIER_MIN_COUNT 3u
#define DEFAULT_MIN_FREQUENCY 2u
#define DEFAULT_BLOOM_BITS_LOG2 20u
#define DEFAULT_BLOOM_HASHES 4u
/* A pending set holds max_pending * dim floats per key: keep it bounded (16 MiB). */
#define MAX_PENDING_FLOATS (4u << 20)

/* Admission and eviction, shared by both table kinds. */
static int s_config_memory_policies(const Carls__TableConfig *in, kb_table_config_t *out, char *err, size_t errlen)
{
    const Carls__AdmissionConfig *a = in->admission;
    out->admission = KB_ADMIT_ALL;
    if (a && a->kind != CARLS__ADMISSION_KIND__ADMIT_ALL) {
        if (a->kind == CARLS__ADMISSION_KIND__ADMIT_FREQUENCY)
            out->admission = KB_ADMIT_FREQUENCY;
        else if (a->kind == CARLS__ADMISSION_KIND__ADMIT_BLOOM)
            out->admission = KB_ADMIT_BLOOM;
        else {
            snprintf(err, errlen, "unknown admission kind %d", (int)a->kind);
            return -1;
        }
        out->min_frequency = a->min_frequency ? a->min_frequency : DEFAULT_MIN_FREQUENCY;
        if (out->min_frequency > 255) {
            snprintf(err, errlen, "admission min_frequency must be at most 255");
            return -1;
        }
        if (out->admission == KB_ADMIT_BLOOM) {
            out->bloom_bits_log2 = a->bloom_bits_log2 ? a->bloom_bits_log2 : DEFAULT_BLOOM_BITS_LOG2;
            out->bloom_hashes = a->bloom_hashes ? a->bloom_hashes : DEFAULT_BLOOM_HASHES;
            if (out->bloom_bits_log2 < 4 || out->bloom_bits_log2 > 30 || out->bloom_hashes > 16) {
                snprintf(err, errlen, "bloom_bits_log2 must be in 4..30 and bloom_hashes in 1..16");
                return -1;
            }
        }
    }
    const Carls__EvictionConfig *e = in->eviction;
    out->eviction = KB_EVICT_NONE;
    if (e && e->kind != CARLS__EVICTION_KIND__EVICT_NONE) {
        if (e->kind == CARLS__EVICTION_KIND__EVICT_LRU)
            out->eviction = KB_EVICT_LRU;
        else if (e->kind == CARLS__EVICTION_KIND__EVICT_OLDEST)
            out->eviction = KB_EVICT_OLDEST;
        else {
            snprintf(err, errlen, "unknown eviction kind %d", (int)e->kind);
            return -1;
        }
        if (e->max_rows == 0) {
            snprintf(err, errlen, "eviction needs max_rows > 0");
            return -1;
        }
        out->max_rows = e->max_rows;
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
    if (in->kind == CARLS__TABLE_KIND__TABLE_FEATURE) {
        if (in->dim != 0 || in->knn) {
            snprintf(err, errlen, "feature tables take no dim and no knn index");
            return -1;
        }
        out->kind = KB_TABLE_FEATURE;
        out->max_pending = 1;
        out->max_age_ms = DEFAULT_MAX_AGE_MS;
        kb_optimizer_config_defaults(&out->optimizer);
        return s_config_memory_policies(in, out, err, errlen);
    }
    if (in->kind != CARLS__TABLE_KIND__TABLE_EMBEDDING) {
        snprintf(err, errlen, "unknown table kind %d", (int)in->kind);
        return -1;
    }
    if (in->dim == 0 || in->dim > max_dim) {
        snprintf(err, errlen, "dim must be in 1..%u, got %u", max_dim, in->dim);
        return -1;
    }
    out->dim = in->dim;
    switch (in->init) {
    case CARLS__INIT_KIND__INIT_ZEROS: out->init = KB_INIT_ZEROS; break;
    case CARLS__INIT_KIND__INIT_UNIFORM: out->init = KB_INIT_UNIFORM; break;
    case CARLS__INIT_KIND__INIT_NORMAL: out->init = KB_INIT_NORMAL; break;
    default: snprintf(err, errlen, "unknown initializer %d", (int)in->init); return -1;
    }
    out->init_scale = in->init_scale != 0.0f ? in->init_scale : DEFAULT_INIT_SCALE;
    if (!isfinite(out->init_scale) || out->init_scale < 0.0f) {
        snprintf(err, errlen, "init_scale must be finite and >= 0");
        return -1;
    }
    out->init_seed = in->init_seed;

    const Carls__OptimizerConfig *opt = in->optimizer;
    kb_optimizer_config_t oc = {0};
    if (opt) {
        switch (opt->kind) {
        case CARLS__OPTIMIZER_KIND__OPT_SGD: oc.kind = KB_OPT_SGD; break;
        case CARLS__OPTIMIZER_KIND__OPT_MOMENTUM: oc.kind = KB_OPT_MOMENTUM; break;
        case CARLS__OPTIMIZER_KIND__OPT_ADAGRAD: oc.kind = KB_OPT_ADAGRAD; break;
        case CARLS__OPTIMIZER_KIND__OPT_ADAM: oc.kind = KB_OPT_ADAM; break;
        default: snprintf(err, errlen, "unknown optimizer %d", (int)opt->kind); return -1;
        }
        oc.learning_rate = opt->learning_rate;
        oc.momentum = opt->momentum;
        oc.beta1 = opt->beta1;
        oc.beta2 = opt->beta2;
        oc.epsilon = opt->epsilon;
        oc.initial_accumulator = opt->initial_accumulator;
    }
    kb_optimizer_config_defaults(&oc);
    if (kb_optimizer_config_validate(&oc, err, (int)errlen) != 0)
        return -1;
    out->optimizer = oc;

    const Carls__LazyUpdateConfig *lazy = in->lazy;
    out->immediate = lazy && lazy->policy == CARLS__UPDATE_POLICY__UPDATE_IMMEDIATE;
    if (lazy && lazy->policy != CARLS__UPDATE_POLICY__UPDATE_LAZY && !out->immediate) {
        snprintf(err, errlen, "unknown update policy %d", (int)lazy->policy);
        return -1;
    }
    out->max_age_ms = lazy && lazy->max_age_ms ? lazy->max_age_ms : DEFAULT_MAX_AGE_MS;
    out->max_pending = lazy && lazy->max_pending ? lazy->max_pending : DEFAULT_MAX_PENDING;
    if (out->max_pending > CARLS_MAX_PENDING_LIMIT) {
        snprintf(err, errlen, "max_pending must be in 1..%u, got %u", CARLS_MAX_PENDING_LIMIT, out->max_pending);
        return -1;
    }
    if (lazy && lazy->outlier_rule == CARLS__OUTLIER_RULE__OUTLIER_NONE)
        out->outlier.rule = KB_OUTLIER_NONE;
    else if (!lazy || lazy->outlier_rule == CARLS__OUTLIER_RULE__OUTLIER_NORM_MEDIAN)
        out->outlier.rule = KB_OUTLIER_NORM_MEDIAN;
    else {
        snprintf(err, errlen, "unknown outlier rule %d", (int)lazy->outlier_rule);
        return -1;
    }
    out->outlier.threshold = lazy && lazy->outlier_threshold != 0.0f ? lazy->outlier_threshold
                                                                     : DEFAULT_OUTLIER_THRESHOLD;
    if (!isfinite(out->outlier.threshold) || out->outlier.threshold < 1.0f) {
        snprintf(err, errlen, "outlier_threshold must be finite and >= 1");
        return -1;
    }
    out->outlier.min_count = lazy && lazy->outlier_min_count ? lazy->outlier_min_count : DEFAULT_OUTLIER_MIN_COUNT;
    if ((uint64_t)out->max_pending * out->dim > MAX_PENDING_FLOATS) {
        snprintf(err, errlen, "max_pending * dim must be at most %u floats", MAX_PENDING_FLOATS);
        return -1;
    }
    if (in->knn && in->knn->spec && in->knn->spec[0]) {
        const Carls__KnnConfig *k = in->knn;
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
        /* Let FAISS judge the spec now, so a bad one is refused at create time with its reason. */
        kb_knn_t *probe = NULL;
        kb_knn_config_t kc;
        kb_table_knn_config(out, &kc);
        kc.background = false;
        char why[200] = "";
        if (kb_knn_new(&kc, &probe, why, sizeof why) != 0) {
            snprintf(err, errlen, "knn spec '%s': %s", k->spec, why);
            return -1;
        }
        kb_knn_destroy(&probe);
    }
    return s_config_memory_policies(in, out, err, errlen);
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
