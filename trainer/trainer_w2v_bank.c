/* The word2vec tables in the knowledge bank (see trainer_w2v.h). */
#include "trainer_w2v.h"

#include "protocol.h"

#include <stdio.h>
#include <string.h>

int w2v_names(const char *base, w2v_names_t *names)
{
    if (!carls_table_name_valid(base) || strlen(base) + 7 > 128)
        return -1;
    snprintf(names->in, sizeof names->in, "%s", base);
    snprintf(names->out, sizeof names->out, "%s.out", base);
    snprintf(names->count, sizeof names->count, "%s.count", base);
    return 0;
}

/* One table's config. dim 0 means the count table. */
static void s_config(const w2v_tables_t *cfg, bool count, bool output, Carls__TableConfig *tc,
                     Carls__OptimizerConfig *opt, Carls__LazyUpdateConfig *lazy, Carls__KnnConfig *knn,
                     Carls__AdmissionConfig *adm)
{
    carls__table_config__init(tc);
    carls__optimizer_config__init(opt);
    carls__lazy_update_config__init(lazy);
    carls__knn_config__init(knn);
    carls__admission_config__init(adm);
    tc->kind = CARLS__TABLE_KIND__TABLE_EMBEDDING;
    tc->optimizer = opt;
    tc->lazy = lazy;
    tc->admission = adm;
    if (count) {
        /* Never updated: zeros, plain SGD, no index. Its frequencies are what matters. */
        tc->dim = 1;
        tc->init = CARLS__INIT_KIND__INIT_ZEROS;
        opt->kind = CARLS__OPTIMIZER_KIND__OPT_SGD;
        lazy->policy = CARLS__UPDATE_POLICY__UPDATE_IMMEDIATE;
        switch (cfg->admission) {
        case W2V_ADMIT_BLOOM:
            adm->kind = CARLS__ADMISSION_KIND__ADMIT_BLOOM;
            adm->min_frequency = cfg->min_count;
            break;
        case W2V_ADMIT_FREQUENCY:
            adm->kind = CARLS__ADMISSION_KIND__ADMIT_FREQUENCY;
            adm->min_frequency = cfg->min_count;
            break;
        case W2V_ADMIT_NONE:
            adm->kind = CARLS__ADMISSION_KIND__ADMIT_ALL;
            break;
        }
        return;
    }
    tc->dim = cfg->dim;
    if (output) {
        tc->init = CARLS__INIT_KIND__INIT_ZEROS;
    } else {
        tc->init = CARLS__INIT_KIND__INIT_UNIFORM;
        tc->init_scale = 0.5f / (float)cfg->dim;
    }
    opt->kind = cfg->adagrad ? CARLS__OPTIMIZER_KIND__OPT_ADAGRAD : CARLS__OPTIMIZER_KIND__OPT_SGD;
    opt->learning_rate = cfg->lr;
    lazy->policy = cfg->lazy ? CARLS__UPDATE_POLICY__UPDATE_LAZY : CARLS__UPDATE_POLICY__UPDATE_IMMEDIATE;
    lazy->max_age_ms = cfg->max_age_ms;
    lazy->max_pending = cfg->max_pending;
    /* Summed per-batch gradients of a frequent word are legitimately much larger than a rare word's in the
     * same pending set; dropping them as outliers would throw away most of the signal. */
    lazy->outlier_rule = CARLS__OUTLIER_RULE__OUTLIER_NONE;
    /* Only words the count table admitted reach these tables (the trainer asks it first). */
    adm->kind = CARLS__ADMISSION_KIND__ADMIT_ALL;
    if (cfg->knn_spec && cfg->knn_spec[0] && strcmp(cfg->knn_spec, "none") != 0) {
        knn->spec = (char *)cfg->knn_spec;
        knn->metric = output ? CARLS__KNN_METRIC__METRIC_IP : CARLS__KNN_METRIC__METRIC_COSINE;
        tc->knn = knn;
    }
}

int w2v_tables_create(kb_cluster_t *kb, const w2v_names_t *names, const w2v_tables_t *cfg)
{
    const char *which[3] = {names->in, names->out, names->count};
    for (int i = 0; i < 3; i++) {
        Carls__TableConfig tc;
        Carls__OptimizerConfig opt;
        Carls__LazyUpdateConfig lazy;
        Carls__KnnConfig knn;
        Carls__AdmissionConfig adm;
        s_config(cfg, i == 2, i == 1, &tc, &opt, &lazy, &knn, &adm);
        int rc = kb_cluster_create_table(kb, which[i], &tc, true);
        if (rc != 0)
            return rc;
    }
    return 0;
}
