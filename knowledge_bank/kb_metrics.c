#include "kb_metrics.h"

#include "kb_latency.h"
#include "prom.h"
#include "util.h"

#include <assert.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- rendering ---- */

/* The per-table metrics that are one number per table, each with the Carls__TableStats field it reads: a
 * uint64_t, or one of 4 bytes (the uint32_t dim, the protobuf_c_boolean flags, which hold 0 or 1). */
typedef struct {
    const char *name, *type, *help;
    size_t offset, size; /* of the field in Carls__TableStats */
} s_table_metric_t;

#define S_TABLE_METRIC(field, name, type, help) \
    {name, type, help, offsetof(Carls__TableStats, field), sizeof(((Carls__TableStats *)0)->field)}

static const s_table_metric_t s_table_metrics[] = {
    S_TABLE_METRIC(rows, "carls_bank_table_rows", "gauge", "Rows held by the table."),
    S_TABLE_METRIC(dim, "carls_bank_table_dim", "gauge", "Embedding dimension (0 for feature tables)."),
    S_TABLE_METRIC(bytes, "carls_bank_table_bytes", "gauge",
                   "Estimated memory held (what --max-memory counts): rows with keys, values, optimizer state, "
                   "pending gradients and feature records, row maps, the nearest-neighbour copy and index."),
    S_TABLE_METRIC(request_errors, "carls_bank_table_request_errors_total", "counter",
                   "Requests on the table answered with a non-OK status."),
    S_TABLE_METRIC(pending_keys, "carls_bank_table_pending_keys", "gauge", "Keys holding gradients not applied yet."),
    S_TABLE_METRIC(pending_gradients, "carls_bank_table_pending_gradients", "gauge",
                   "Gradients waiting to be applied."),
    S_TABLE_METRIC(gradients_received, "carls_bank_table_gradients_received_total", "counter", "Gradient rows pushed."),
    S_TABLE_METRIC(gradients_applied, "carls_bank_table_gradients_applied_total", "counter",
                   "Gradient rows that went into an applied average."),
    S_TABLE_METRIC(outliers_dropped, "carls_bank_table_outliers_dropped_total", "counter",
                   "Gradient rows dropped as outliers by the lazy update."),
    S_TABLE_METRIC(updates_applied, "carls_bank_table_updates_applied_total", "counter", "Optimizer steps taken."),
    S_TABLE_METRIC(lookups, "carls_bank_table_keys_looked_up_total", "counter", "Keys looked up."),
    S_TABLE_METRIC(puts, "carls_bank_table_rows_put_total", "counter", "Rows written by put."),
    S_TABLE_METRIC(not_admitted, "carls_bank_table_not_admitted_total", "counter",
                   "Lookups and pushes of keys the admission policy kept out."),
    S_TABLE_METRIC(not_persisted, "carls_bank_table_not_persisted", "gauge",
                   "Rows held in memory only, below the admission frequency."),
    S_TABLE_METRIC(evictions, "carls_bank_table_evictions_total", "counter", "Rows dropped by the eviction policy."),
    S_TABLE_METRIC(knn_count, "carls_bank_table_index_vectors", "gauge", "Vectors in the nearest-neighbour copy."),
    S_TABLE_METRIC(knn_indexed, "carls_bank_table_index_indexed", "gauge", "Vectors in the FAISS index."),
    S_TABLE_METRIC(knn_pending, "carls_bank_table_index_pending", "gauge",
                   "Changes the nearest-neighbour index does not reflect yet (staleness)."),
    S_TABLE_METRIC(knn_rebuilds, "carls_bank_table_index_builds_total", "counter", "Index builds completed."),
    S_TABLE_METRIC(knn_failed_builds, "carls_bank_table_index_failed_builds_total", "counter",
                   "Index builds that failed."),
    S_TABLE_METRIC(knn_ready, "carls_bank_table_index_ready", "gauge",
                   "1 when a usable index exists (0: brute force)."),
    S_TABLE_METRIC(knn_building, "carls_bank_table_index_building", "gauge", "1 while an index build runs."),
    S_TABLE_METRIC(memory_refusals, "carls_bank_table_memory_refusals_total", "counter",
                   "Requests on the table refused with RESOURCE_EXHAUSTED (over --max-memory)."),
    S_TABLE_METRIC(memory_refused_rows, "carls_bank_table_memory_refused_rows_total", "counter",
                   "New rows asked for by the requests refused over --max-memory."),
};

static double s_table_value(const Carls__TableStats *t, const s_table_metric_t *m)
{
    const char *field = (const char *)t + m->offset;
    if (m->size == sizeof(uint64_t)) {
        uint64_t v;
        memcpy(&v, field, sizeof v);
        return (double)v;
    }
    uint32_t v;
    assert(m->size == sizeof v);
    memcpy(&v, field, sizeof v);
    return (double)v;
}

/* The labels [table="...",]op="..." of one summary, escaped (malloc'd; caller frees), or NULL without memory. */
static char *s_labels(const char *table, const char *op)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return NULL;
    if (table) {
        fputs("table=\"", f);
        carls_prom_label_value(f, table);
        fputs("\",", f);
    }
    fputs("op=\"", f);
    carls_prom_label_value(f, op);
    fputc('"', f);
    if (fclose(f) != 0) {
        free(text);
        return NULL;
    }
    return text;
}

/* Latency of a list of summaries in seconds, labelled {[table="...",]op="..."} (table NULL: the server-wide
 * figures): with name, the histograms (name_bucket, _sum, _count) of the summaries that carry buckets (a
 * server fills le_counts with kb_latency_summarize); with max_name instead, the maxima. */
static void s_latency_samples(FILE *f, const char *name, const char *max_name, const char *table,
                              Carls__LatencySummary *const *lat, size_t n)
{
    double bounds[KB_LATENCY_LE_BUCKETS];
    for (int i = 0; i < KB_LATENCY_LE_BUCKETS; i++)
        bounds[i] = ldexp(1e-6, i); /* 2^i microseconds */
    for (size_t i = 0; i < n; i++) {
        char *labels = s_labels(table, lat[i]->op);
        if (!labels)
            continue;
        if (max_name) {
            fprintf(f, "%s{%s} %.9g\n", max_name, labels, lat[i]->max_us * 1e-6);
        } else if (lat[i]->n_le_counts > 0) {
            size_t nb = lat[i]->n_le_counts < KB_LATENCY_LE_BUCKETS ? lat[i]->n_le_counts : KB_LATENCY_LE_BUCKETS;
            carls_prom_histogram(f, name, labels, bounds, lat[i]->le_counts, nb, lat[i]->count,
                                 lat[i]->sum_us * 1e-6);
        }
        free(labels);
    }
}

/* Request counts of a list of summaries as name{[table="...",]op="..."}. */
static void s_count_samples(FILE *f, const char *name, const char *table, Carls__LatencySummary *const *lat,
                            size_t n)
{
    for (size_t i = 0; i < n; i++) {
        fprintf(f, "%s{", name);
        if (table) {
            fputs("table=\"", f);
            carls_prom_label_value(f, table);
            fputs("\",", f);
        }
        fputs("op=\"", f);
        carls_prom_label_value(f, lat[i]->op);
        fprintf(f, "\"} %llu\n", (unsigned long long)lat[i]->count);
    }
}

int kb_metrics_render(const Carls__StatsResult *st, char **text_out, size_t *len_out)
{
    assert(st && text_out && len_out);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return -1;

    carls_prom_metric(f, "carls_bank_uptime_seconds", "gauge", (double)st->uptime_ms / 1000.0,
             "Seconds since the server started.");
    carls_prom_family(f, "carls_bank_info", "gauge", "Server settings as labels (value 1).");
    fputs("carls_bank_info{durability=\"", f);
    carls_prom_label_value(f, st->durability);
    fprintf(f, "\",threads=\"%u\"} 1\n", st->threads);
    carls_prom_metric(f, "carls_bank_tables", "gauge", (double)st->n_tables, "Tables held.");
    carls_prom_metric(f, "carls_bank_requests_total", "counter", (double)st->requests,
             "Requests handled (every table and operation).");
    carls_prom_metric(f, "carls_bank_request_errors_total", "counter", (double)st->errors,
             "Requests answered with a non-OK status.");
    carls_prom_metric(f, "carls_bank_malformed_frames_total", "counter", (double)st->malformed_frames,
             "Frames that could not be read as a request (undecodable, or multi-part and dropped).");
    carls_prom_metric(f, "carls_bank_duplicate_writes_total", "counter", (double)st->duplicate_writes,
             "Retried writes recognised by (client id, sequence) and not applied again.");
    carls_prom_metric(f, "carls_bank_commits_total", "counter", (double)st->commits,
                      "Commits: journal appends that held changes.");
    carls_prom_metric(f, "carls_bank_commit_failures_total", "counter", (double)st->commit_failures,
             "Commits (journal appends) that failed.");
    carls_prom_metric(f, "carls_bank_rows_written_total", "counter", (double)st->rows_written,
             "Whole row records committed (value, metadata, state; deletions).");
    carls_prom_metric(f, "carls_bank_frequencies_written_total", "counter", (double)st->frequencies_written,
             "Frequency-only updates committed: use counts changed by reads, written in bulk.");
    carls_prom_metric(f, "carls_bank_journal_bytes", "gauge", (double)st->journal_bytes,
                      "Bytes in journal segments not yet removed.");
    carls_prom_metric(f, "carls_bank_compactions_total", "counter", (double)st->compactions,
                      "Transactions that moved journaled epochs into SQLite.");
    carls_prom_metric(f, "carls_bank_compacted_epoch", "gauge", (double)st->compacted_epoch,
                      "The newest epoch SQLite holds.");
    carls_prom_metric(f, "carls_bank_compaction_queue_rows", "gauge", (double)st->compaction_queue_rows,
                      "Rows journaled but not yet in SQLite.");
    carls_prom_metric(f, "carls_bank_compaction_queue_bytes", "gauge", (double)st->compaction_queue_bytes,
                      "Memory the rows journaled but not yet in SQLite hold, pending gradients included.");
    carls_prom_metric(f, "carls_bank_compaction_rows_skipped_total", "counter", (double)st->compaction_rows_skipped,
                      "Journaled row writes a newer one superseded before compaction.");
    carls_prom_metric(f, "carls_bank_compactions_without_pending_total", "counter",
                      (double)st->compactions_without_pending,
                      "Compactions that stored rows without their pending gradients (the journal holds them).");
    carls_prom_metric(f, "carls_bank_committed_epoch", "gauge", (double)st->committed_epoch,
             "Last committed epoch (group commit number).");
    carls_prom_metric(f, "carls_bank_memory_bytes", "gauge", (double)st->memory_bytes,
             "The server's estimate of the memory its data takes (what --max-memory limits).");
    carls_prom_metric(f, "carls_bank_memory_limit_bytes", "gauge", (double)st->memory_limit,
                      "--max-memory (0: unlimited).");
    carls_prom_metric(f, "carls_bank_memory_refusals_total", "counter", (double)st->memory_refusals,
             "Requests refused with RESOURCE_EXHAUSTED because their new rows or table would exceed --max-memory.");
    carls_prom_metric(f, "carls_bank_resident_bytes", "gauge", (double)st->rss_bytes,
                      "The process's resident set size.");
    carls_prom_metric(f, "carls_bank_cache_bytes", "gauge", (double)st->cache_bytes,
                      "--cache-bytes: the budget of the cached tables (0: every row in memory).");
    carls_prom_metric(f, "carls_bank_cache_resident_bytes", "gauge", (double)st->cache_resident_bytes,
                      "The cached tables' estimated memory now.");
    carls_prom_metric(f, "carls_bank_cache_reads_total", "counter", (double)st->cache_reads,
                      "Keys missing from memory looked for in SQLite.");
    carls_prom_metric(f, "carls_bank_cache_loads_total", "counter", (double)st->cache_loads,
                      "Rows read back from SQLite into memory.");
    carls_prom_metric(f, "carls_bank_cache_evictions_total", "counter", (double)st->cache_evictions,
                      "Clean rows that left memory (they stay in SQLite).");

    carls_prom_family(f, "carls_bank_op_requests_total", "counter", "Requests handled, by operation.");
    s_count_samples(f, "carls_bank_op_requests_total", NULL, st->latency, st->n_latency);
    carls_prom_family(f, "carls_bank_request_duration_seconds", "histogram",
                      "Request latency by operation since start (buckets at 2^i microseconds, exact).");
    s_latency_samples(f, "carls_bank_request_duration_seconds", NULL, NULL, st->latency, st->n_latency);
    carls_prom_family(f, "carls_bank_request_duration_max_seconds", "gauge",
                      "The slowest request by operation since start.");
    s_latency_samples(f, NULL, "carls_bank_request_duration_max_seconds", NULL, st->latency, st->n_latency);

    for (size_t m = 0; m < sizeof s_table_metrics / sizeof s_table_metrics[0]; m++) {
        const s_table_metric_t *metric = &s_table_metrics[m];
        carls_prom_family(f, metric->name, metric->type, metric->help);
        for (size_t i = 0; i < st->n_tables; i++) {
            fprintf(f, "%s{table=\"", metric->name);
            carls_prom_label_value(f, st->tables[i]->name);
            fprintf(f, "\"} %.15g\n", s_table_value(st->tables[i], metric));
        }
    }
    carls_prom_family(f, "carls_bank_table_updates_by_trigger_total", "counter",
             "Lazy updates applied, by what triggered them: a lookup, max_age_ms, or max_pending.");
    for (size_t i = 0; i < st->n_tables; i++) {
        const Carls__TableStats *t = st->tables[i];
        const char *triggers[3] = {"lookup", "age", "count"};
        uint64_t values[3] = {t->applied_on_lookup, t->applied_on_age, t->applied_on_count};
        for (int k = 0; k < 3; k++) {
            fputs("carls_bank_table_updates_by_trigger_total{table=\"", f);
            carls_prom_label_value(f, t->name);
            fprintf(f, "\",trigger=\"%s\"} %llu\n", triggers[k], (unsigned long long)values[k]);
        }
    }
    carls_prom_family(f, "carls_bank_table_index_last_build_age_seconds", "gauge",
             "Seconds since the nearest-neighbour index was last built (tables whose index was built).");
    int64_t now_ms = carls_wall_ms();
    for (size_t i = 0; i < st->n_tables; i++) {
        const Carls__TableStats *t = st->tables[i];
        if (t->knn_last_build_ms <= 0)
            continue;
        double age = (double)(now_ms - t->knn_last_build_ms) / 1000.0;
        fputs("carls_bank_table_index_last_build_age_seconds{table=\"", f);
        carls_prom_label_value(f, t->name);
        fprintf(f, "\"} %.6g\n", age < 0 ? 0.0 : age);
    }
    carls_prom_family(f, "carls_bank_table_requests_total", "counter", "Requests on the table, by operation.");
    for (size_t i = 0; i < st->n_tables; i++)
        s_count_samples(f, "carls_bank_table_requests_total", st->tables[i]->name, st->tables[i]->requests,
                        st->tables[i]->n_requests);
    carls_prom_family(f, "carls_bank_table_request_duration_seconds", "histogram",
                      "Request latency on the table by operation since start (buckets at 2^i microseconds).");
    for (size_t i = 0; i < st->n_tables; i++)
        s_latency_samples(f, "carls_bank_table_request_duration_seconds", NULL, st->tables[i]->name,
                          st->tables[i]->requests, st->tables[i]->n_requests);
    carls_prom_family(f, "carls_bank_table_request_duration_max_seconds", "gauge",
                      "The slowest request on the table by operation since start.");
    for (size_t i = 0; i < st->n_tables; i++)
        s_latency_samples(f, NULL, "carls_bank_table_request_duration_max_seconds", st->tables[i]->name,
                          st->tables[i]->requests, st->tables[i]->n_requests);

    if (fclose(f) != 0) {
        free(text);
        return -1;
    }
    *text_out = text;
    *len_out = len;
    return 0;
}

/* ---- HTTP ---- */

struct kb_metrics_server {
    kb_service_t *service;
    carls_prom_server_t *http;
};

/* One scrape: a stats snapshot rendered as text. */
static int s_render(void *ctx, char **text, size_t *len)
{
    kb_metrics_server_t *self = ctx;
    Carls__StatsResult *st = NULL;
    if (kb_service_stats_snapshot(self->service, &st) != 0)
        return -1;
    int rc = kb_metrics_render(st, text, len);
    carls__stats_result__free_unpacked(st, NULL);
    return rc;
}

int kb_metrics_server_start(kb_service_t *service, const char *address, uint16_t port, kb_metrics_server_t **out,
                            char *err, size_t errlen)
{
    assert(service && address && out);
    *out = NULL;
    kb_metrics_server_t *self = carls_xcalloc(1, sizeof *self);
    self->service = service;
    if (carls_prom_server_start(s_render, self, address, port, &self->http, err, errlen) != 0) {
        free(self);
        return -1;
    }
    *out = self;
    return 0;
}

uint16_t kb_metrics_server_port(const kb_metrics_server_t *self) { return carls_prom_server_port(self->http); }

uint64_t kb_metrics_server_scrapes(const kb_metrics_server_t *self)
{
    return carls_prom_server_scrapes(self->http);
}

void kb_metrics_server_stop(kb_metrics_server_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    carls_prom_server_stop(&(*self_p)->http);
    free(*self_p);
    *self_p = NULL;
}
