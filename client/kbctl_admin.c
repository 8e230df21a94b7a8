/* kbctl's verbs for the bank's tables and its whole state: create-table, list-tables, drop-table, stats,
 * checkpoint, snapshot, snapshots, snapshot-delete (kbctl_verb.h). */
#include "kbctl_verb.h"

#include "kb_cluster.h"
#include "protocol.h"
#include "util.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The wire enums these verbs name (carls_enum_name, proto/protocol.h). */
static const kbctl_enum_t *const s_optimizers = &carls__optimizer_kind__descriptor;
static const kbctl_enum_t *const s_updates = &carls__update_policy__descriptor;
static const kbctl_enum_t *const s_inits = &carls__init_kind__descriptor;
static const kbctl_enum_t *const s_outlier_rules = &carls__outlier_rule__descriptor;
static const kbctl_enum_t *const s_kinds = &carls__table_kind__descriptor;
static const kbctl_enum_t *const s_metrics = &carls__knn_metric__descriptor;
static const kbctl_enum_t *const s_admissions = &carls__admission_kind__descriptor;
static const kbctl_enum_t *const s_evictions = &carls__eviction_kind__descriptor;

/* Parses a float option that must be > 0 (a zero on the wire means "the server's default", so an explicit
 * 0 could not be honoured) and, when below_one, < 1. 0, or -1 after printing why. */
static int s_opt_positive_float(const char *verb, const char *opt, const char *text, bool below_one, float *out)
{
    float v;
    if (carls_parse_float(text, &v) != 0) {
        fprintf(stderr, "kbctl %s: --%s wants a number, not \"%s\"\n", verb, opt, text);
        return -1;
    }
    if (!(v > 0) || (below_one && !(v < 1))) {
        fprintf(stderr, "kbctl %s: --%s must be %s (leave it out for the server's default)\n", verb, opt,
                below_one ? "> 0 and < 1" : "> 0");
        return -1;
    }
    *out = v;
    return 0;
}

/* Heads shard s's block of output when there are several shards. */
static void s_print_shard_header(const kb_cluster_t *c, uint32_t s)
{
    if (kb_cluster_shards(c) > 1)
        printf("%sshard %u %s\n", s ? "\n" : "", s, kb_cluster_endpoint(c, s));
}

/* ---- create-table, list-tables, drop-table ----------------------------------------------------------- */

static const char s_create_table_usage[] =
    "usage: kbctl create-table NAME --dim D [options] | NAME --kind feature [options]\n"
    "Creates a table on every shard. Options left out take the server's defaults.\n"
    "  --kind embedding|feature     vectors (default) or feature records (neighbours, labels, bytes)\n"
    "  --dim D                      values per row (required for embedding tables)\n"
    "  --optimizer sgd|momentum|adagrad|adam\n"
    "  --lr X  --momentum X  --beta1 X  --beta2 X  --epsilon X  --initial-accumulator X\n"
    "  --update lazy|immediate      apply pushed gradients lazily (averaged) or one by one\n"
    "  --max-age-ms N  --max-pending N (1..1024)\n"
    "  --outlier-rule norm-median|none  --outlier-threshold X  --outlier-min-count N\n"
    "  --init zeros|uniform|normal  --init-scale X  --seed N\n"
    "  --knn SPEC                   nearest-neighbour index: a FAISS factory string (Flat, IVF256,Flat, HNSW32)\n"
    "  --metric ip|l2|cosine  --nprobe N (IVF)  --ef-search N (HNSW)\n"
    "  --admission all|frequency|bloom  --min-frequency N  --bloom-bits-log2 N  --bloom-hashes N\n"
    "  --eviction none|lru|oldest  --max-rows N\n"
    "  --if-not-exists              succeed without change when the table exists with the same config\n"
    "Only --admission, --eviction and their options apply to feature tables.\n";

enum {
    CT_DIM, CT_OPTIMIZER, CT_LR, CT_MOMENTUM, CT_BETA1, CT_BETA2, CT_EPSILON, CT_ACCUMULATOR, CT_UPDATE,
    CT_MAX_AGE, CT_MAX_PENDING, CT_OUTLIER_THRESHOLD, CT_OUTLIER_RULE, CT_OUTLIER_MIN, CT_INIT, CT_INIT_SCALE,
    CT_SEED, CT_IF_NOT_EXISTS, CT_KIND, CT_KNN, CT_METRIC, CT_NPROBE, CT_EF_SEARCH, CT_ADMISSION, CT_MIN_FREQ,
    CT_BLOOM_BITS, CT_BLOOM_HASHES, CT_EVICTION, CT_MAX_ROWS, CT_N
};
static const kbctl_opt_t s_create_table_opts[CT_N] = {
    [CT_DIM] = {"dim", true},
    [CT_OPTIMIZER] = {"optimizer", true},
    [CT_LR] = {"lr", true},
    [CT_MOMENTUM] = {"momentum", true},
    [CT_BETA1] = {"beta1", true},
    [CT_BETA2] = {"beta2", true},
    [CT_EPSILON] = {"epsilon", true},
    [CT_ACCUMULATOR] = {"initial-accumulator", true},
    [CT_UPDATE] = {"update", true},
    [CT_MAX_AGE] = {"max-age-ms", true},
    [CT_MAX_PENDING] = {"max-pending", true},
    [CT_OUTLIER_THRESHOLD] = {"outlier-threshold", true},
    [CT_OUTLIER_RULE] = {"outlier-rule", true},
    [CT_OUTLIER_MIN] = {"outlier-min-count", true},
    [CT_INIT] = {"init", true},
    [CT_INIT_SCALE] = {"init-scale", true},
    [CT_SEED] = {"seed", true},
    [CT_IF_NOT_EXISTS] = {"if-not-exists", false},
    [CT_KIND] = {"kind", true},
    [CT_KNN] = {"knn", true},
    [CT_METRIC] = {"metric", true},
    [CT_NPROBE] = {"nprobe", true},
    [CT_EF_SEARCH] = {"ef-search", true},
    [CT_ADMISSION] = {"admission", true},
    [CT_MIN_FREQ] = {"min-frequency", true},
    [CT_BLOOM_BITS] = {"bloom-bits-log2", true},
    [CT_BLOOM_HASHES] = {"bloom-hashes", true},
    [CT_EVICTION] = {"eviction", true},
    [CT_MAX_ROWS] = {"max-rows", true},
};

/* The config create-table sends: cfg points into the parts it uses. */
typedef struct {
    Carls__TableConfig cfg;
    Carls__OptimizerConfig opt;
    Carls__LazyUpdateConfig lazy;
    Carls__KnnConfig knn;
    Carls__AdmissionConfig adm;
    Carls__EvictionConfig ev;
} s_new_table_t;

/* --kind, and which options it rules out: feature tables hold records, not vectors, so the vector options
 * cannot apply (the server would refuse dim and knn; the optimizer ones would be silently meaningless),
 * and an embedding table needs --dim. 0, or -1 after printing why. */
static int s_create_kind(const kbctl_call_t *call, s_new_table_t *t)
{
    int kind = CARLS__TABLE_KIND__TABLE_EMBEDDING;
    if (kbctl_opt_choice(call, CT_KIND, s_kinds, &kind) != 0)
        return -1;
    t->cfg.kind = (Carls__TableKind)kind;
    if (kind == CARLS__TABLE_KIND__TABLE_EMBEDDING) {
        if (!call->opt[CT_DIM]) {
            fprintf(stderr, "kbctl %s: --dim is required\n", call->name);
            return -1;
        }
        t->cfg.optimizer = &t->opt;
        t->cfg.lazy = &t->lazy;
        return 0;
    }
    static const int vector_only[] = {CT_DIM,        CT_OPTIMIZER,         CT_LR,           CT_MOMENTUM,
                                      CT_BETA1,      CT_BETA2,             CT_EPSILON,      CT_ACCUMULATOR,
                                      CT_UPDATE,     CT_MAX_AGE,           CT_MAX_PENDING,  CT_OUTLIER_THRESHOLD,
                                      CT_OUTLIER_RULE, CT_OUTLIER_MIN,     CT_INIT,         CT_INIT_SCALE,
                                      CT_SEED,       CT_KNN,               CT_METRIC,       CT_NPROBE,
                                      CT_EF_SEARCH};
    for (size_t i = 0; i < sizeof vector_only / sizeof vector_only[0]; i++) {
        if (call->opt[vector_only[i]]) {
            fprintf(stderr, "kbctl %s: --%s does not apply to a feature table\n", call->name,
                    s_create_table_opts[vector_only[i]].name);
            return -1;
        }
    }
    return 0;
}

/* --dim and the named choices of an embedding table (optimizer, update policy, outlier rule, init). 0, or
 * -1 after printing why. */
static int s_create_choices(const kbctl_call_t *call, s_new_table_t *t)
{
    uint64_t dim = 0;
    if (kbctl_opt_count(call, CT_DIM, 1, UINT32_MAX, &dim) != 0)
        return -1;
    t->cfg.dim = (uint32_t)dim;
    int optimizer = t->opt.kind, update = t->lazy.policy, outlier_rule = t->lazy.outlier_rule, init = t->cfg.init;
    if (kbctl_opt_choice(call, CT_OPTIMIZER, s_optimizers, &optimizer) != 0 ||
        kbctl_opt_choice(call, CT_UPDATE, s_updates, &update) != 0 ||
        kbctl_opt_choice(call, CT_OUTLIER_RULE, s_outlier_rules, &outlier_rule) != 0 ||
        kbctl_opt_choice(call, CT_INIT, s_inits, &init) != 0)
        return -1;
    t->opt.kind = (Carls__OptimizerKind)optimizer;
    t->lazy.policy = (Carls__UpdatePolicy)update;
    t->lazy.outlier_rule = (Carls__OutlierRule)outlier_rule;
    t->cfg.init = (Carls__InitKind)init;
    return 0;
}

/* The numeric options: floats > 0 (some also < 1) and whole numbers in a range. 0, or -1 after printing
 * why. */
static int s_create_numbers(const kbctl_call_t *call, s_new_table_t *t)
{
    const struct {
        int o;
        float *dst;
        bool below_one;
    } floats[] = {
        {CT_LR, &t->opt.learning_rate, false},     {CT_MOMENTUM, &t->opt.momentum, true},
        {CT_BETA1, &t->opt.beta1, true},           {CT_BETA2, &t->opt.beta2, true},
        {CT_EPSILON, &t->opt.epsilon, false},      {CT_ACCUMULATOR, &t->opt.initial_accumulator, false},
        {CT_OUTLIER_THRESHOLD, &t->lazy.outlier_threshold, false}, {CT_INIT_SCALE, &t->cfg.init_scale, false},
    };
    for (size_t i = 0; i < sizeof floats / sizeof floats[0]; i++) {
        const char *text = call->opt[floats[i].o];
        if (text && s_opt_positive_float(call->name, s_create_table_opts[floats[i].o].name, text,
                                         floats[i].below_one, floats[i].dst) != 0)
            return -1;
    }
    /* The destination is a u32 or a u64 field. */
    const struct {
        int o;
        uint64_t lo, hi;
        uint32_t *dst32;
        uint64_t *dst64;
    } ints[] = {
        {CT_MAX_AGE, 1, UINT32_MAX, &t->lazy.max_age_ms, NULL},
        {CT_MAX_PENDING, 1, CARLS_MAX_PENDING_LIMIT, &t->lazy.max_pending, NULL},
        {CT_OUTLIER_MIN, 1, UINT32_MAX, &t->lazy.outlier_min_count, NULL},
        {CT_SEED, 0, UINT64_MAX, NULL, &t->cfg.init_seed},
        {CT_NPROBE, 1, UINT32_MAX, &t->knn.nprobe, NULL},
        {CT_EF_SEARCH, 1, UINT32_MAX, &t->knn.ef_search, NULL},
        {CT_MIN_FREQ, 1, UINT32_MAX, &t->adm.min_frequency, NULL},
        {CT_BLOOM_BITS, 1, 30, &t->adm.bloom_bits_log2, NULL},
        {CT_BLOOM_HASHES, 1, 64, &t->adm.bloom_hashes, NULL},
        {CT_MAX_ROWS, 1, UINT64_MAX, NULL, &t->ev.max_rows},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        uint64_t u;
        if (!call->opt[ints[i].o])
            continue;
        if (kbctl_opt_count(call, ints[i].o, ints[i].lo, ints[i].hi, &u) != 0)
            return -1;
        if (ints[i].dst32)
            *ints[i].dst32 = (uint32_t)u;
        else
            *ints[i].dst64 = u;
    }
    return 0;
}

/* The nearest-neighbour index: --knn names it; the other index options only make sense with it. 0, or -1
 * after printing why. */
static int s_create_index(const kbctl_call_t *call, s_new_table_t *t)
{
    const char *spec = call->opt[CT_KNN];
    if (!spec) {
        if (call->opt[CT_METRIC] || call->opt[CT_NPROBE] || call->opt[CT_EF_SEARCH]) {
            fprintf(stderr, "kbctl %s: --metric, --nprobe and --ef-search need --knn SPEC\n", call->name);
            return -1;
        }
        return 0;
    }
    if (!*spec) {
        fprintf(stderr, "kbctl %s: --knn wants a FAISS index spec such as Flat, IVF256,Flat or HNSW32\n",
                call->name);
        return -1;
    }
    t->knn.spec = (char *)spec;
    int metric = t->knn.metric;
    if (kbctl_opt_choice(call, CT_METRIC, s_metrics, &metric) != 0)
        return -1;
    t->knn.metric = (Carls__KnnMetric)metric;
    t->cfg.knn = &t->knn;
    return 0;
}

/* Admission and eviction, each with the options that go with it. 0, or -1 after printing why. */
static int s_create_admission_eviction(const kbctl_call_t *call, s_new_table_t *t)
{
    int admission = t->adm.kind, eviction = t->ev.kind;
    if (kbctl_opt_choice(call, CT_ADMISSION, s_admissions, &admission) != 0)
        return -1;
    t->adm.kind = (Carls__AdmissionKind)admission;
    if ((call->opt[CT_MIN_FREQ] && admission == CARLS__ADMISSION_KIND__ADMIT_ALL) ||
        ((call->opt[CT_BLOOM_BITS] || call->opt[CT_BLOOM_HASHES]) &&
         admission != CARLS__ADMISSION_KIND__ADMIT_BLOOM)) {
        fprintf(stderr, "kbctl %s: --min-frequency needs --admission frequency|bloom; --bloom-bits-log2 and "
                        "--bloom-hashes need --admission bloom\n", call->name);
        return -1;
    }
    if (call->opt[CT_ADMISSION])
        t->cfg.admission = &t->adm;
    if (kbctl_opt_choice(call, CT_EVICTION, s_evictions, &eviction) != 0)
        return -1;
    t->ev.kind = (Carls__EvictionKind)eviction;
    if ((eviction != CARLS__EVICTION_KIND__EVICT_NONE) != (call->opt[CT_MAX_ROWS] != NULL)) {
        fprintf(stderr, "kbctl %s: --eviction lru|oldest and --max-rows N go together\n", call->name);
        return -1;
    }
    if (call->opt[CT_EVICTION])
        t->cfg.eviction = &t->ev;
    return 0;
}

static int s_create_table(kbctl_call_t *call)
{
    const char *name = call->pos[0];
    s_new_table_t t = {CARLS__TABLE_CONFIG__INIT,  CARLS__OPTIMIZER_CONFIG__INIT, CARLS__LAZY_UPDATE_CONFIG__INIT,
                       CARLS__KNN_CONFIG__INIT,    CARLS__ADMISSION_CONFIG__INIT, CARLS__EVICTION_CONFIG__INIT};
    if (s_create_kind(call, &t) != 0 || s_create_choices(call, &t) != 0 || s_create_numbers(call, &t) != 0 ||
        s_create_index(call, &t) != 0 || s_create_admission_eviction(call, &t) != 0)
        return KBCTL_EXIT_USAGE;
    int st = kbctl_open(call);
    if (st != KBCTL_EXIT_OK)
        return st;
    bool if_not_exists = call->opt[CT_IF_NOT_EXISTS] != NULL;
    int rc = kb_cluster_create_table(call->c, name, &t.cfg, if_not_exists);
    if (rc != 0)
        return kbctl_fail(call, rc);
    const char *done = if_not_exists ? "created or found" : "created";
    if (t.cfg.kind == CARLS__TABLE_KIND__TABLE_FEATURE)
        fprintf(stderr, "%s feature table %s\n", done, name);
    else
        fprintf(stderr, "%s table %s (dim %u, %s, %s%s%s)\n", done, name, t.cfg.dim,
                carls_enum_name_of(s_optimizers, t.opt.kind).text, carls_enum_name_of(s_updates, t.lazy.policy).text,
                t.cfg.knn ? ", knn " : "", t.cfg.knn ? t.knn.spec : "");
    return KBCTL_EXIT_OK;
}

static const char s_list_tables_usage[] =
    "usage: kbctl list-tables\n"
    "One line per table, tab-separated: name, dim, rows, optimizer, update policy. With several shards the\n"
    "tables are shard 0's and rows are summed over the shards.\n";

static int s_list_tables(kbctl_call_t *call)
{
    int st = kbctl_open(call);
    if (st != KBCTL_EXIT_OK)
        return st;
    Carls__Response *resp = NULL;
    int rc = kb_cluster_list_tables(call->c, &resp);
    if (rc != 0)
        return kbctl_fail(call, rc);
    for (size_t i = 0; i < resp->table_list->n_tables; i++) {
        const Carls__TableInfo *t = resp->table_list->tables[i];
        const Carls__TableConfig *cfg = t->config;
        printf("%s\t%u\t%llu\t%s\t%s\n", t->name ? t->name : "", cfg ? cfg->dim : 0, (unsigned long long)t->rows,
               carls_enum_name_of(s_optimizers, (cfg && cfg->optimizer) ? (int)cfg->optimizer->kind : 0).text,
               carls_enum_name_of(s_updates, (cfg && cfg->lazy) ? (int)cfg->lazy->policy : 0).text);
    }
    carls__response__free_unpacked(resp, NULL);
    return KBCTL_EXIT_OK;
}

static const char s_drop_table_usage[] =
    "usage: kbctl drop-table NAME [--if-exists]\n"
    "Deletes a table and its rows. --if-exists: succeed when there is no such table.\n";

enum { DT_IF_EXISTS, DT_N };
static const kbctl_opt_t s_drop_table_opts[DT_N] = {[DT_IF_EXISTS] = {"if-exists", false}};

static int s_drop_table(kbctl_call_t *call)
{
    int st = kbctl_open(call);
    if (st != KBCTL_EXIT_OK)
        return st;
    int rc = kb_cluster_drop_table(call->c, call->pos[0], call->opt[DT_IF_EXISTS] != NULL);
    if (rc != 0)
        return kbctl_fail(call, rc);
    fprintf(stderr, "dropped table %s\n", call->pos[0]);
    return KBCTL_EXIT_OK;
}

/* ---- stats, checkpoint ------------------------------------------------------------------------------- */

/* Prints one "LABEL OP: count N, p50 X us, p99 Y us, max Z us" line per operation. */
static void s_print_latencies(const char *label, Carls__LatencySummary *const *ops, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const Carls__LatencySummary *l = ops[i];
        printf("%s %s: count %llu, p50 %.1f us, p99 %.1f us, max %.1f us\n", label, l->op ? l->op : "",
               (unsigned long long)l->count, l->p50_us, l->p99_us, l->max_us);
    }
}

/* Prints one server's stats block (what `kbctl stats` shows for one shard). */
static void s_print_stats(const Carls__StatsResult *s)
{
    printf("server\n");
    printf("uptime_ms: %llu\n", (unsigned long long)s->uptime_ms);
    printf("threads: %u\n", s->threads);
    printf("durability: %s\n", s->durability ? s->durability : "");
    printf("requests: %llu\n", (unsigned long long)s->requests);
    printf("errors: %llu\n", (unsigned long long)s->errors);
    printf("malformed_frames: %llu\n", (unsigned long long)s->malformed_frames);
    printf("duplicate_writes: %llu\n", (unsigned long long)s->duplicate_writes);
    printf("commits: %llu\n", (unsigned long long)s->commits);
    printf("committed_epoch: %llu\n", (unsigned long long)s->committed_epoch);
    printf("commit_failures: %llu\n", (unsigned long long)s->commit_failures);
    printf("rows_written: %llu\n", (unsigned long long)s->rows_written);
    printf("frequencies_written: %llu\n", (unsigned long long)s->frequencies_written);
    printf("journal_bytes: %llu\n", (unsigned long long)s->journal_bytes);
    printf("compactions: %llu\n", (unsigned long long)s->compactions);
    printf("compacted_epoch: %llu\n", (unsigned long long)s->compacted_epoch);
    printf("compaction_queue_rows: %llu\n", (unsigned long long)s->compaction_queue_rows);
    printf("compaction_queue_bytes: %llu\n", (unsigned long long)s->compaction_queue_bytes);
    printf("compacting: %s\n", s->compacting ? "yes" : "no");
    printf("compaction_rows_skipped: %llu\n", (unsigned long long)s->compaction_rows_skipped);
    printf("compactions_without_pending: %llu\n", (unsigned long long)s->compactions_without_pending);
    if (s->cache_bytes) { /* kb-server --cache-bytes (docs/STATE.md) */
        printf("cache_bytes: %llu\n", (unsigned long long)s->cache_bytes);
        printf("cache_resident_bytes: %llu\n", (unsigned long long)s->cache_resident_bytes);
        printf("cache_reads: %llu\n", (unsigned long long)s->cache_reads);
        printf("cache_loads: %llu\n", (unsigned long long)s->cache_loads);
        printf("cache_evictions: %llu\n", (unsigned long long)s->cache_evictions);
    }
    printf("memory_bytes: %llu\n", (unsigned long long)s->memory_bytes);
    printf("memory_limit: %llu%s\n", (unsigned long long)s->memory_limit, s->memory_limit ? "" : " (unlimited)");
    printf("memory_refusals: %llu\n", (unsigned long long)s->memory_refusals);
    printf("memory_refused_rows: %llu\n", (unsigned long long)s->memory_refused_rows);
    printf("rss_bytes: %llu\n", (unsigned long long)s->rss_bytes);
    s_print_latencies("latency", s->latency, s->n_latency);
    for (size_t i = 0; i < s->n_tables; i++) {
        const Carls__TableStats *t = s->tables[i];
        printf("\ntable %s\n", t->name ? t->name : "");
        printf("dim: %u\n", t->dim);
        printf("rows: %llu\n", (unsigned long long)t->rows);
        printf("lookups: %llu\n", (unsigned long long)t->lookups);
        printf("puts: %llu\n", (unsigned long long)t->puts);
        printf("pending_keys: %llu\n", (unsigned long long)t->pending_keys);
        printf("pending_gradients: %llu\n", (unsigned long long)t->pending_gradients);
        printf("gradients_received: %llu\n", (unsigned long long)t->gradients_received);
        printf("gradients_applied: %llu\n", (unsigned long long)t->gradients_applied);
        printf("outliers_dropped: %llu\n", (unsigned long long)t->outliers_dropped);
        printf("updates_applied: %llu\n", (unsigned long long)t->updates_applied);
        printf("applied_on_lookup: %llu\n", (unsigned long long)t->applied_on_lookup);
        printf("applied_on_age: %llu\n", (unsigned long long)t->applied_on_age);
        printf("applied_on_count: %llu\n", (unsigned long long)t->applied_on_count);
        printf("kind: %s\n", carls_enum_name_of(s_kinds, (int)t->kind).text);
        printf("not_admitted: %llu\n", (unsigned long long)t->not_admitted);
        printf("not_persisted: %llu\n", (unsigned long long)t->not_persisted);
        printf("evictions: %llu\n", (unsigned long long)t->evictions);
        printf("knn_ready: %s\n", t->knn_ready ? "true" : "false");
        printf("knn_count: %llu\n", (unsigned long long)t->knn_count);
        printf("knn_indexed: %llu\n", (unsigned long long)t->knn_indexed);
        printf("knn_pending: %llu\n", (unsigned long long)t->knn_pending);
        printf("knn_rebuilds: %llu\n", (unsigned long long)t->knn_rebuilds);
        printf("bytes: %llu\n", (unsigned long long)t->bytes);
        printf("request_errors: %llu\n", (unsigned long long)t->request_errors);
        printf("memory_refusals: %llu\n", (unsigned long long)t->memory_refusals);
        printf("memory_refused_rows: %llu\n", (unsigned long long)t->memory_refused_rows);
        s_print_latencies("requests", t->requests, t->n_requests);
    }
}

static const char s_stats_usage[] =
    "usage: kbctl stats [TABLE]\n"
    "Prints server-wide counters, latency percentiles per operation, then one block per table (or only\n"
    "TABLE): \"key: value\" lines, blocks separated by a blank line. With several shards, each shard's\n"
    "output follows a line \"shard I ENDPOINT\".\n";

static int s_stats(kbctl_call_t *call)
{
    const char *table = call->n_pos ? call->pos[0] : NULL;
    int st = kbctl_open(call);
    if (st != KBCTL_EXIT_OK)
        return st;
    for (uint32_t s = 0; s < kb_cluster_shards(call->c); s++) {
        Carls__Response *resp = NULL;
        int rc = kb_cluster_stats(call->c, s, table, &resp);
        if (rc != 0)
            return kbctl_fail(call, rc);
        s_print_shard_header(call->c, s);
        s_print_stats(resp->stats);
        carls__response__free_unpacked(resp, NULL);
    }
    return KBCTL_EXIT_OK;
}

static const char s_checkpoint_usage[] =
    "usage: kbctl checkpoint\n"
    "Asks every server to commit everything and checkpoint its database; prints committed_epoch and rows\n"
    "(per shard, after a \"shard I ENDPOINT\" line, when there are several).\n";

static int s_checkpoint(kbctl_call_t *call)
{
    int st = kbctl_open(call);
    if (st != KBCTL_EXIT_OK)
        return st;
    uint32_t shards = kb_cluster_shards(call->c);
    Carls__CheckpointResult *res = carls_xcalloc(shards, sizeof *res);
    int rc = kb_cluster_checkpoint(call->c, res);
    if (rc != 0) {
        st = kbctl_fail(call, rc);
    } else {
        for (uint32_t s = 0; s < shards; s++) {
            s_print_shard_header(call->c, s);
            printf("committed_epoch: %llu\nrows: %llu\n", (unsigned long long)res[s].committed_epoch,
                   (unsigned long long)res[s].rows);
        }
    }
    free(res);
    return st;
}

/* ---- snapshots (docs/STATE.md "Snapshots") ---------------------------------------------------------- */

/* One snapshot as a tab-separated line: name, time taken (UTC), cut epoch, tables (comma-separated), bytes,
 * and "valid" or "damaged: why". */
static void s_print_snapshot(const Carls__SnapshotInfo *si)
{
    char when[32] = "?";
    time_t secs = (time_t)(si->created_ms / 1000);
    struct tm tm;
    if (gmtime_r(&secs, &tm))
        strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    printf("%s\t%s\t%llu\t", si->name, when, (unsigned long long)si->cut_epoch);
    for (size_t i = 0; i < si->n_tables; i++)
        printf("%s%s", i ? "," : "", si->tables[i]);
    printf("%s\t%llu\t%s%s\n", si->n_tables ? "" : "-", (unsigned long long)si->bytes,
           si->valid ? "valid" : "damaged: ", si->valid ? "" : si->problem);
}

/* Every shard's answer to a list, printed (only the snapshot `only` when not NULL). */
static void s_print_snapshots(const kbctl_call_t *call, Carls__Response **per_shard, const char *only)
{
    for (uint32_t s = 0; s < kb_cluster_shards(call->c); s++) {
        s_print_shard_header(call->c, s);
        const Carls__SnapshotResult *res = per_shard[s]->snapshot;
        for (size_t i = 0; i < res->n_snapshots; i++)
            if (!only || strcmp(res->snapshots[i]->name, only) == 0)
                s_print_snapshot(res->snapshots[i]);
        carls__response__free_unpacked(per_shard[s], NULL);
    }
}

/* Lists the snapshots of every shard and prints them. Exit status. */
static int s_list_snapshots(kbctl_call_t *call, bool verify, const char *only)
{
    Carls__Response **per_shard = carls_xcalloc(kb_cluster_shards(call->c), sizeof *per_shard);
    int rc = kb_cluster_snapshot_each(call->c, CARLS__SNAPSHOT_ACTION__SNAPSHOT_LIST, NULL, verify, per_shard);
    if (rc == 0)
        s_print_snapshots(call, per_shard, only);
    free(per_shard);
    return rc == 0 ? KBCTL_EXIT_OK : kbctl_fail(call, rc);
}

static const char s_snapshot_usage[] =
    "usage: kbctl snapshot NAME\n"
    "Takes snapshot NAME of the whole bank while it serves: every shard copies all its tables (values,\n"
    "versions, optimizer state, pending gradients, use counts) as of one cut into DATA/snapshots/NAME, with\n"
    "a manifest of CRC-32s. Every write acknowledged before the command started is in it; none begun after\n"
    "it returned is. NAME: 1..64 characters of [A-Za-z0-9_.-], not beginning with '.'; an existing NAME is\n"
    "refused. When a shard fails, the parts the others took are deleted again. Prints each shard's snapshot\n"
    "as `kbctl snapshots` does. A large bank takes a while: raise --timeout-ms (a resend waits for the\n"
    "snapshot in progress). Restore with `kb-server --restore NAME` (on every shard, with its --shard).\n";

static int s_snapshot(kbctl_call_t *call)
{
    int st = kbctl_open_and_run_named(call, kb_cluster_snapshot);
    return st != KBCTL_EXIT_OK ? st : s_list_snapshots(call, false, call->pos[0]);
}

enum { SNL_VERIFY, SNL_N };
static const kbctl_opt_t s_snapshots_opts[SNL_N] = {[SNL_VERIFY] = {"verify", false}};

static const char s_snapshots_usage[] =
    "usage: kbctl snapshots [--verify]\n"
    "Lists every shard's snapshots (after a \"shard I ENDPOINT\" line when there are several), one per line:\n"
    "NAME<TAB>TAKEN (UTC)<TAB>CUT EPOCH<TAB>TABLES<TAB>BYTES<TAB>valid, or damaged: WHY (naming the file).\n"
    "Checks each manifest and its files' sizes; --verify also reads every file and checks its CRC-32.\n"
    "A snapshot without a manifest (interrupted while it was taken) is listed as damaged.\n";

static int s_snapshots(kbctl_call_t *call)
{
    int st = kbctl_open(call);
    return st != KBCTL_EXIT_OK ? st : s_list_snapshots(call, call->opt[SNL_VERIFY] != NULL, NULL);
}

static const char s_snapshot_delete_usage[] =
    "usage: kbctl snapshot-delete NAME\n"
    "Deletes snapshot NAME (valid or damaged) on every shard. A shard without it answers NOT_FOUND (exit\n"
    "status 2); the others delete theirs.\n";

static int s_snapshot_delete(kbctl_call_t *call)
{
    int st = kbctl_open_and_run_named(call, kb_cluster_snapshot_delete);
    if (st == KBCTL_EXIT_OK)
        fprintf(stderr, "deleted snapshot %s\n", call->pos[0]);
    return st;
}

/* ---- the verbs ---- */

const kbctl_verb_t kbctl_verb_create_table = {"create-table", s_create_table_usage, s_create_table_opts, KBCTL_COUNT(s_create_table_opts), 1, 1, true, s_create_table};
const kbctl_verb_t kbctl_verb_list_tables = {"list-tables", s_list_tables_usage, NULL, 0, 0, 0, false, s_list_tables};
const kbctl_verb_t kbctl_verb_drop_table = {"drop-table", s_drop_table_usage, s_drop_table_opts, KBCTL_COUNT(s_drop_table_opts), 1, 1, true, s_drop_table};
const kbctl_verb_t kbctl_verb_stats = {"stats", s_stats_usage, NULL, 0, 0, 1, true, s_stats};
const kbctl_verb_t kbctl_verb_checkpoint = {"checkpoint", s_checkpoint_usage, NULL, 0, 0, 0, false, s_checkpoint};
const kbctl_verb_t kbctl_verb_snapshot = {"snapshot", s_snapshot_usage, NULL, 0, 1, 1, false, s_snapshot};
const kbctl_verb_t kbctl_verb_snapshots = {"snapshots", s_snapshots_usage, s_snapshots_opts, KBCTL_COUNT(s_snapshots_opts), 0, 0, false, s_snapshots};
const kbctl_verb_t kbctl_verb_snapshot_delete = {"snapshot-delete", s_snapshot_delete_usage, NULL, 0, 1, 1, false, s_snapshot_delete};
